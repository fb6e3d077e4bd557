"""Our processor as one step among others of a Ray Dataset: read, filter, generate (speculative
decoding with our default drafter), keep what you need, write. Run from the repository root:

    python -m examples.chain --output /tmp/answers
"""

from __future__ import annotations

import argparse

import ray

from pipeline.llm import build_processor, vLLMEngineProcessorConfig

QUESTIONS = [
    {"id": 1, "topic": "math", "question": "What is 17 times 3? Answer with the number."},
    {"id": 2, "topic": "code", "question": "Write a Python function that reverses a string."},
    {"id": 3, "topic": "math", "question": "Is 91 a prime number? Explain briefly."},
    {"id": 4, "topic": "chat", "question": "Say hello."},
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="a directory (or s3://...) for the Parquet files")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()

    questions = ray.data.from_items(QUESTIONS)  # or ray.data.read_json / read_parquet / ...
    processor = build_processor(
        vLLMEngineProcessorConfig(
            model_source="smollm2-135m-instruct",
            batch_size=8,
            placement_group_config={"bundles": [{"CPU": 1}]},
            should_continue_on_error=True,
        ),
        preprocess=lambda row: dict(
            messages=[{"role": "user", "content": row["question"]}],
            sampling_params=dict(temperature=0, max_tokens=args.max_tokens),
        ),
    )
    answers = (
        processor(questions.filter(lambda row: row["topic"] != "chat"))
        .filter(lambda row: not row["__inference_error__"])
        .map(
            lambda row: {
                "id": row["id"],
                "topic": row["topic"],
                "answer": row["generated_text"],
                "finish_reason": row["finish_reason"],
                "tokens_per_call": row["tokens_per_call"],
            }
        )
    )
    answers.write_parquet(args.output)
    for row in ray.data.read_parquet(args.output).sort("id").take_all():
        print(
            f"{row['id']} [{row['topic']}] {row['finish_reason']}, {row['tokens_per_call']:.2f} tokens per call: "
            f"{row['answer'][:60]!r}"
        )


if __name__ == "__main__":
    main()
