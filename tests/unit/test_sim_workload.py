"""Trace loading for the simulator: Azure 2023 CSV, Mooncake JSONL, vendored slices, cutting and scaling."""

from __future__ import annotations

import gzip
import itertools
from pathlib import Path

import pytest

from inferencepool.engine_sim.kv import chunk_hashes
from inferencepool.sim import workload
from inferencepool.sim.workload import TraceError, TraceRequest


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_azure_csv_gives_seconds_since_the_first_request(tmp_path: Path) -> None:
    path = write(
        tmp_path / "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:04.5000000,300,0\n"
        "2023-11-16 18:17:03.2500000,4808,10\n",
    )
    requests = workload.load(path)
    # sorted by arrival; 7 fractional digits accepted; a 0-token output still generates one token
    assert requests == [TraceRequest(0.0, 4808, 10), TraceRequest(1.25, 300, 1)]


def test_mooncake_jsonl_keeps_block_hashes_and_ms_timestamps(tmp_path: Path) -> None:
    path = write(
        tmp_path / "m.jsonl",
        '{"timestamp": 1500, "input_length": 600, "output_length": 5, "hash_ids": [0, 7]}\n'
        '{"timestamp": 500, "input_length": 512, "output_length": 2, "hash_ids": [0]}\n',
    )
    assert workload.load(path) == [TraceRequest(0.0, 512, 2, (0,)), TraceRequest(1.0, 600, 5, (0, 7))]


def test_gzipped_traces_read_like_plain_ones(tmp_path: Path) -> None:
    text = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,10,2\n"
    with gzip.open(tmp_path / "a.csv.gz", "wt") as handle:
        handle.write(text)
    assert workload.load(str(tmp_path / "a.csv.gz")) == workload.load(write(tmp_path / "a.csv", text))


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.csv", "TIMESTAMP,ContextTokens\n", r"a\.csv, line 1: missing column\(s\) GeneratedTokens"),
        (
            "a.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,10,2\n"
            "2023-11-16 18:17:04.0,ten,2\n",
            r"a\.csv, line 3: field 'ContextTokens' must be an integer, got 'ten'",
        ),
        (
            "a.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,2\n",
            r"a\.csv, line 2: field 'TIMESTAMP' is not a date and time: 'yesterday'",
        ),
        (
            "a.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.0,0,2\n",
            r"line 2: field 'ContextTokens' must be >= 1, got 0",
        ),
        ("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", r"a\.csv: no requests after the header"),
        (
            "m.jsonl",
            '{"timestamp": 0, "input_length": 5}\n',
            r"m\.jsonl, line 1: missing field 'output_length'",
        ),
        ("m.jsonl", "\n{not json\n", r"m\.jsonl, line 2: not JSON"),
        (
            "m.jsonl",
            '{"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]}\n',
            r"line 1: field 'hash_ids' has 2 blocks, input_length 1025 needs 3",
        ),
        (
            "m.jsonl",
            '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": ["x"]}\n',
            r"line 1: field 'hash_ids' must be a list of integers",
        ),
        ("t.txt", "whatever\n", r"t\.txt: unknown trace format"),
    ],
)
def test_bad_traces_name_file_line_and_field(tmp_path: Path, name: str, text: str, message: str) -> None:
    with pytest.raises(TraceError, match=message):
        workload.load(write(tmp_path / name, text))


def test_missing_file_names_the_vendored_choices() -> None:
    with pytest.raises(
        TraceError, match=r"no-such\.csv: no such file, and not a vendored trace \(azure-code"
    ):
        workload.load("no-such.csv")


@pytest.mark.parametrize("name", sorted(workload.VENDORED))
def test_vendored_slices_load(name: str) -> None:
    requests = workload.load(name)
    assert len(requests) > 500
    assert requests[0].arrival == 0.0
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(requests))
    assert (workload.DATA_DIR / "README.md").read_text().count(
        "Licen"
    ) >= 2  # attribution shipped with the data


def test_shape_cuts_a_range_and_scales_the_rate() -> None:
    requests = [TraceRequest(float(t), 100, 1) for t in range(10)]
    shaped = workload.shape(requests, start=2, duration=4, rate=2)
    assert [r.arrival for r in shaped] == [0.0, 0.5, 1.0, 1.5]
    assert len(workload.shape(requests, max_requests=3)) == 3
    with pytest.raises(ValueError, match="no requests between 20s and 25s"):
        workload.shape(requests, start=20, duration=5)
    with pytest.raises(ValueError, match="rate must be > 0"):
        workload.shape(requests, rate=0)


def test_mooncake_blocks_become_shared_prompt_prefixes() -> None:
    first = workload.prompt_ids(TraceRequest(0, 1300, 1, (0, 1, 2)), 0)
    second = workload.prompt_ids(TraceRequest(0, 1300, 1, (0, 1, 9)), 1)
    assert len(first) == 1300 and first[511] == 0 and first[512] == 1 and first[1299] == 2
    assert first[500:520] == [0] * 12 + [1] * 8  # slices cross block boundaries
    # the engine's chained 256-token chunk hashes agree exactly on the two shared 512-token blocks
    a, b = chunk_hashes(first), chunk_hashes(second)
    assert a[:4] == b[:4] and a[4] != b[4]
    # Azure prompts share nothing
    x, y = workload.prompt_ids(TraceRequest(0, 600, 1), 0), workload.prompt_ids(TraceRequest(0, 600, 1), 1)
    assert x[0:3] == [x[0], x[0] + 1, x[0] + 2]
    assert not set(chunk_hashes(x)) & set(chunk_hashes(y))


def test_azure_ids_stay_32_bit_and_distinct_beyond_4095_prompts() -> None:
    """A full hour of an Azure trace has thousands of prompts; the router packs ids into 4 bytes."""
    count = 20_000
    firsts = set()
    for number in range(count):
        ids = workload.prompt_ids(TraceRequest(0, 8192, 1), number)
        assert ids[0] >= 0 and ids[len(ids) - 1] < 1 << 32
        firsts.add(ids[0])
    assert len(firsts) == count  # no two prompts share a first chunk, so no false prefix hit
    # the first prompts keep their old far-apart ids
    assert workload.prompt_ids(TraceRequest(0, 10, 1), 0)[0] == workload.AZURE_ID_STRIDE
