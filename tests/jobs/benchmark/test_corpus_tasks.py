"""The corpus tasks: a few hundred prompts each, in a fixed order, one instruction per task around
one document each, no document in two tasks, the code task's functions valid Python."""

import ast

import pytest

from jobs.benchmark.corpus_tasks import CORPUS_TASKS, REWRITE_CODE, corpus_texts
from jobs.benchmark.datasets import load_prompts

COUNT = 300


@pytest.fixture(scope="module")
def prompts():
    return {task: load_prompts(task, COUNT) for task in CORPUS_TASKS}


def test_each_task_has_a_few_hundred_prompts_with_their_own_ids_in_a_fixed_order(prompts):
    for task, rows in prompts.items():
        assert len(rows) == COUNT, task
        assert len({row.request_id for row in rows}) == COUNT and all(r.request_id.startswith(task) for r in rows)
        assert [prompt for _, prompt in corpus_texts(task, 20)] == [r.prompt for r in rows[:20]]


def test_one_instruction_per_task_around_a_document_no_document_in_two_tasks(prompts):
    documents = {}
    for task, rows in prompts.items():
        instructions = {row.prompt.split("\n\n")[0] for row in rows}
        assert len(instructions) == 1, f"{task}: {len(instructions)} instructions"
        documents[task] = {row.prompt.split("\n\n", 1)[1] for row in rows}
        assert len(documents[task]) == COUNT, f"{task}: a document twice"
    texts = [documents[t] for t in ("corpus-extract-json", "corpus-edit-text", "corpus-summarize")]
    bodies = [{d.split("Text:\n", 1)[1] for d in group} for group in texts]
    assert not (bodies[0] & bodies[1]) and not (bodies[0] & bodies[2]) and not (bodies[1] & bodies[2])


def test_the_code_task_rewrites_whole_functions(prompts):
    for row in prompts["corpus-rewrite-code"]:
        code = row.prompt[len(REWRITE_CODE) :].removesuffix("\n```")
        tree = ast.parse(code)
        assert isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) and len(tree.body) == 1


def test_an_unknown_task_names_the_tasks():
    with pytest.raises(ValueError, match="corpus-extract-json, corpus-edit-text"):
        corpus_texts("corpus-translate")


def test_the_extraction_schema_is_the_form_the_prompt_asks_for():
    import json

    from jobs.benchmark.corpus_tasks import EXTRACT_JSON, EXTRACT_JSON_SCHEMA, structured_outputs

    form = json.loads(EXTRACT_JSON[EXTRACT_JSON.index("{") : EXTRACT_JSON.rindex("}") + 1])
    assert set(form) == set(EXTRACT_JSON_SCHEMA["required"]) == set(EXTRACT_JSON_SCHEMA["properties"])
    assert structured_outputs("corpus-extract-json") == {"json": EXTRACT_JSON_SCHEMA}
    with pytest.raises(ValueError, match="corpus-summarize.*no answer schema"):
        structured_outputs("corpus-summarize")
