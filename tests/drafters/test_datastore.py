import json
import random

import numpy as np
import pytest

from drafters.datastore import SEPARATOR, Datastore, build_datastore
from tests.drafters.reference import continuations, find_longest_suffix_match

SEP = int(SEPARATOR)


def random_documents(rng: random.Random, vocab: list[int]) -> list[list[int]]:
    return [[rng.choice(vocab) for _ in range(rng.randint(1, 12))] for _ in range(rng.randint(1, 5))]


def brute_force_match(tokens: list[int], context: list[int], max_len: int, min_len: int):
    """(match_len, sorted positions) of the longest context suffix found by scanning the corpus."""
    for length in range(min(max_len, len(context)), min_len - 1, -1):
        pattern = context[len(context) - length :]
        positions = [p for p in range(len(tokens)) if tokens[p : p + length] == pattern]
        if positions:
            return length, positions
    return 0, []


def test_suffix_array_is_sorted_suffixes(tmp_path):
    rng = random.Random(0)
    # Small vocabularies force long shared prefixes; large ids need more than one byte per token.
    for trial, vocab in enumerate([[1, 2], [0, 1, 2, 3], [5, 70_000, 150_000, 150_001]] * 10):
        documents = random_documents(rng, vocab)
        store = build_datastore(documents, tmp_path / f"ds{trial}", meta={})
        tokens = store.tokens.tolist()
        assert tokens == sum(([SEP] + d for d in documents), [])[1:]
        assert store.suffix_array.tolist() == sorted(range(len(tokens)), key=lambda p: tokens[p:])


def test_longest_match_equals_brute_force(tmp_path):
    rng = random.Random(1)
    for trial in range(40):
        vocab = [1, 2, 3] if trial % 2 else [7, 8, 100_000]
        store = build_datastore(random_documents(rng, vocab), tmp_path / f"ds{trial}", meta={})
        tokens = store.tokens.tolist()
        for _ in range(20):
            context = [rng.choice(vocab + [4]) for _ in range(rng.randint(0, 8))]
            max_len, min_len = rng.randint(1, 6), rng.randint(1, 3)
            expected_length, positions = brute_force_match(tokens, context, max_len, min_len)

            def reference(*a, store=store):
                return find_longest_suffix_match(store.tokens, store.suffix_array, *a)

            for search in (store.match, reference):
                length, lo, hi = search(context, max_len, min_len)  # the compiled search, and the reference
                assert length == expected_length, (tokens, context, max_len, min_len)
                assert sorted(store.suffix_array[lo:hi].tolist()) == positions
                assert (lo, hi) != (0, 0) or length == 0


def test_no_match_gives_zeros(tmp_path):
    store = build_datastore([[1, 2, 3]], tmp_path / "ds", meta={})
    assert store.match([9, 9]) == (0, 0, 0)
    assert store.match([3]) == (0, 0, 0)  # shorter than min_len = 2
    assert store.match([], min_len=1) == (0, 0, 0)


def test_match_does_not_cross_separator(tmp_path):
    # "2 3" runs across the boundary only; "9 2" lies inside the second document.
    store = build_datastore([[1, 2], [3, 4], [9, 2, 5]], tmp_path / "ds", meta={})
    assert store.match([1, 2, 3]) == (0, 0, 0)
    length, lo, hi = store.match([0, 9, 2])
    assert length == 2 and store.suffix_array[lo:hi].tolist() == [6]


def test_continuations_stop_at_separator(tmp_path):
    store = build_datastore([[1, 2, 3], [1, 2, 4, 5, 6, 7], [0, 1, 2]], tmp_path / "ds", meta={})
    length, lo, hi = store.match([1, 2])
    assert (length, hi - lo) == (2, 3)
    rows = store.continuations(lo, hi, length, length=3)
    assert rows.dtype == np.uint32 and rows.shape == (2, 3)
    # Suffix order: "1 2 <end>" (no continuation: left out) < "1 2 3 SEP" < "1 2 4 5".
    assert rows.tolist() == [[3, SEP, SEP], [4, 5, 6]]
    assert [tuple(t for t in row if t != SEP) for row in rows.tolist()] == continuations(
        store.tokens, store.suffix_array, lo, hi, length, length=3
    )
    assert store.continuations(lo, hi, length, length=2, max_occurrences=1).shape == (0, 2)
    assert store.continuations(0, 0, 2, length=4).shape == (0, 4)


def test_open_maps_read_only_arrays_and_meta(tmp_path):
    build_datastore([[1, 2, 3], [], [4]], tmp_path / "ds", meta={"model": "toy"})
    store = Datastore.open(tmp_path / "ds")
    assert isinstance(store.tokens, np.memmap) and isinstance(store.suffix_array, np.memmap)
    assert not store.tokens.flags.writeable and not store.suffix_array.flags.writeable
    assert store.meta["model"] == "toy"
    assert (store.meta["num_tokens"], store.meta["num_documents"], store.meta["num_empty_documents"]) == (4, 2, 1)
    assert store.meta["bytes_on_disk"] > 0 and len(store) == 5


def test_rebuild_replaces_datastore_and_leaves_no_staging(tmp_path):
    build_datastore([[1, 2, 3]], tmp_path / "ds", meta={})
    build_datastore([[4, 5]], tmp_path / "ds", meta={})
    assert Datastore.open(tmp_path / "ds").tokens.tolist() == [4, 5]
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]
    assert (tmp_path / "ds").stat().st_mode & 0o777 == 0o755


def test_refuses_to_replace_a_directory_that_is_not_a_datastore(tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="notes"):
        build_datastore([[1, 2]], tmp_path / "notes", meta={})
    assert (tmp_path / "notes" / "keep.txt").exists()


def test_open_missing_directory_names_path_and_build_command(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing.*tokens\.npy.*jobs\.build_datastore"):
        Datastore.open(tmp_path / "missing")


def test_bad_corpus_errors(tmp_path):
    with pytest.raises(ValueError, match="no tokens"):
        build_datastore([[], []], tmp_path / "ds", meta={})
    with pytest.raises(ValueError, match="document 1"):
        build_datastore([[1], [SEP]], tmp_path / "ds", meta={})


def test_cli_reads_jsonl_truncated_json_and_directory(tmp_path, tiny_model_dir):
    from jobs.build_datastore import main

    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_text(
        "\n".join(
            [
                json.dumps({"text": "def add(a, b):\n    return a + b"}),
                json.dumps(
                    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
                ),
                json.dumps({"title": "no text here"}),
                "not json",
            ]
        )
        + "\n"
    )
    records = [
        {
            "id": str(i),
            "conversations": [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": f"answer {i}"}],
        }
        for i in range(3)
    ]
    full = json.dumps(records, indent=2)
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(full[: full.index('"answer 2"') + 5])  # cut inside the last record
    code = tmp_path / "code"
    (code / "pkg").mkdir(parents=True)
    (code / "a.py").write_text("import os\nprint(os.getcwd())\n")
    (code / "pkg" / "b.py").write_text("x = 1\n")
    (code / "pkg" / "blob.py").write_bytes(b"\x00\x01binary")
    (code / "notes.md").write_text("not a .py file")

    summary = main(
        [
            "--corpus",
            str(jsonl),
            str(sharegpt),
            str(code),
            "--model",
            str(tiny_model_dir),
            "--out",
            str(tmp_path / "ds"),
        ]
    )
    # jsonl: 2 texts, 2 skipped; json: 2 complete records; directory: 2 .py files, 1 binary.
    assert (summary["num_documents"], summary["records_skipped"], summary["files_skipped"]) == (6, 2, 1)
    assert summary["truncated_tail_chars"] > 0
    store = Datastore.open(tmp_path / "ds")
    assert store.meta["num_tokens"] == summary["num_tokens"] > 0
    assert store.meta["vocab_size"] > 1000 and store.meta["model_fingerprint"]

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    first = tokenizer("def add(a, b):\n    return a + b", add_special_tokens=False)["input_ids"]
    assert store.tokens[: len(first)].tolist() == first
    assert store.match(tokenizer("x = 1", add_special_tokens=False)["input_ids"])[0] >= 2

    capped = main(
        ["--corpus", str(jsonl), "--model", str(tiny_model_dir), "--out", str(tmp_path / "capped"), "--max-tokens", "3"]
    )
    assert capped["num_tokens"] == 3


def test_cli_unknown_file_type_names_path(tmp_path, tiny_model_dir):
    from jobs.build_datastore import main

    corpus = tmp_path / "corpus.csv"
    corpus.write_text("text\nhello\n")
    with pytest.raises(ValueError, match="corpus.csv"):
        main(["--corpus", str(corpus), "--model", str(tiny_model_dir), "--out", str(tmp_path / "ds")])


def test_a_store_of_segments_finds_the_longest_match_of_any_segment(tmp_path):
    """Segments closed by a SEPARATOR and joined (a series' store): the longest match is the union's,
    its range the occurrences in one segment (the newest on a tie); a store of segments on disk (a
    meta.json naming them) opens joined."""
    rng = random.Random(2)
    for trial in range(20):
        vocab = [1, 2, 3]
        parts = [random_documents(rng, vocab) for _ in range(3)]
        segments = [
            build_datastore(p, tmp_path / f"t{trial}" / f"seg={i}", {}, closed=i < 2) for i, p in enumerate(parts)
        ]
        store = Datastore.join(segments, {})
        tokens = store.tokens.tolist()
        for _ in range(20):
            context = [rng.choice(vocab + [4]) for _ in range(rng.randint(0, 8))]
            expected_length, positions = brute_force_match(tokens, context, 6, 1)
            length, lo, hi = store.match(context, 6, 1)
            assert length == expected_length, (parts, context)
            found = store.suffix_array[lo:hi].tolist()
            assert set(found) <= set(positions) and (lo < hi or length == 0)
            segment = [s for s in store.segments.tolist() if s[0] <= lo < s[1] or length == 0]
            assert length == 0 or all(segment[0][0] <= i < segment[0][1] for i in range(lo, hi))
    (tmp_path / "t0" / "v=1").mkdir()
    (tmp_path / "t0" / "v=1" / "meta.json").write_text('{"segments": ["seg=0", "seg=1", "seg=2"]}')
    opened = Datastore.open(tmp_path / "t0" / "v=1")
    assert len(opened.segments) == 3 and opened.meta["segments"] == ["seg=0", "seg=1", "seg=2"]
    # A driver checks the store without reading (or joining) an array: a torn array passes the
    # check, which names a missing segment's file.
    (tmp_path / "t0" / "seg=1" / "suffix_array.npy").write_bytes(b"torn")
    meta, found = Datastore.check(tmp_path / "t0" / "v=1")
    assert meta["segments"] == ["seg=0", "seg=1", "seg=2"] and [p.name for p in found] == meta["segments"]
    (tmp_path / "t0" / "seg=2" / "tokens.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"seg=2/tokens\.npy does not exist"):
        Datastore.check(tmp_path / "t0" / "v=1")


def test_on_a_tie_the_newest_segment_wins_and_the_object_stores_copy_keeps_the_segments(tmp_path):
    from pipeline.loading.drafters import DrafterTables

    older = build_datastore([[1, 2, 3, 9]], tmp_path / "seg=1", {}, closed=True)
    newer = build_datastore([[1, 2, 3, 8]], tmp_path / "seg=2", {})
    store = Datastore.join([older, newer], {})
    length, lo, hi = store.match([1, 2, 3], 3, 1)
    assert length == 3 and store.segments[1][0] <= lo < hi <= store.segments[1][1]
    assert store.continuations(lo, hi, length, 1).tolist() == [[8]]  # the newest segment's continuation
    copied = DrafterTables(datastore=store).as_plain_arrays().datastore  # what the job shares with its actors
    assert copied.segments.tolist() == store.segments.tolist()
