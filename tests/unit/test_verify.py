"""verify.py's pure logic, without torch: gaps, hidden sizes, metadata, rendering, the CLI.

Reading real ``.pt`` / ``.safetensors`` files is tested in tests/e2e/test_verify_outputs.py.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speccompat import cli
from speccompat.verify import (
    Expected,
    FileResult,
    Format,
    Gap,
    Status,
    VerifyReport,
    discover,
    find_gaps,
    hidden_size_from_config,
    index_of,
    model_hidden_size,
    read_metadata,
)

TORCH_IMPORTABLE = importlib.util.find_spec("torch") is not None

# --------------------------------------------------------------------------- gaps


def test_index_of() -> None:
    assert index_of("data_12.pt") == ("data_{i}.pt", 12)
    assert index_of("hs_0.safetensors") == ("hs_{i}.safetensors", 0)
    assert index_of("hidden_states/hs_3.safetensors") == ("hidden_states/hs_{i}.safetensors", 3)
    for name in ("token_freq.pt", "data_x.pt", "data_1.pt.lock", "req-1.safetensors",
                 "data_config.json", "mydata_1.pt"):
        assert index_of(name) is None, name


def test_gap_in_the_middle() -> None:
    assert find_gaps(["data_0.pt", "data_1.pt", "data_3.pt"]) == (Gap("data_{i}.pt", (2,)),)


def test_no_gap() -> None:
    assert find_gaps(["data_2.pt", "data_0.pt", "data_1.pt", "data_config.json"]) == ()
    assert find_gaps([]) == ()


def test_sequences_start_at_zero() -> None:
    assert find_gaps(["data_2.pt"]) == (Gap("data_{i}.pt", (0, 1)),)


def test_each_sequence_on_its_own() -> None:
    names = ["data_0.pt", "data_2.pt", "hs_1.safetensors", "hidden_states/hs_0.safetensors",
             "hidden_states/req-7.safetensors"]
    assert find_gaps(names) == (
        Gap("data_{i}.pt", (1,)),
        Gap("hs_{i}.safetensors", (0,)),
    )


def test_indices_recorded_in_sample_lengths_count() -> None:
    assert find_gaps(["data_0.pt", "data_1.pt"], recorded=[0, 1, 2, 3]) == (
        Gap("data_{i}.pt", (2, 3)),)
    assert find_gaps([], recorded=[0]) == (Gap("data_{i}.pt", (0,)),)


@given(st.sets(st.integers(min_value=0, max_value=300), min_size=1))
def test_gaps_are_exactly_the_absent_indices(present: set[int]) -> None:
    gaps = find_gaps(f"data_{i}.pt" for i in present)
    missing = set(range(max(present) + 1)) - present
    assert sum((g.indices for g in gaps), ()) == tuple(sorted(missing))


def test_gap_describe_compresses_ranges() -> None:
    gap = Gap("data_{i}.pt", (2, 5, 6, 7, 9))
    assert gap.describe() == ("5 indices missing from data_{i}.pt: data_2.pt, "
                              "data_5.pt .. data_7.pt, data_9.pt")
    assert Gap("hs_{i}.safetensors", (0,)).describe() == (
        "1 index missing from hs_{i}.safetensors: hs_0.safetensors")
    assert gap.as_dict()["files"] == ["data_2.pt", "data_5.pt", "data_6.pt", "data_7.pt",
                                      "data_9.pt"]


# --------------------------------------------------------------------------- hidden size


def test_hidden_size_from_config() -> None:
    assert hidden_size_from_config({"hidden_size": 7168}) == 7168
    assert hidden_size_from_config({"text_config": {"hidden_size": 5120}}) == 5120
    assert hidden_size_from_config({"hidden_size": 64, "text_config": {"hidden_size": 5}}) == 64
    assert hidden_size_from_config({"vision_config": {"hidden_size": 1}}) is None
    assert hidden_size_from_config({"hidden_size": True}) is None
    assert hidden_size_from_config({"hidden_size": "64"}) is None
    assert hidden_size_from_config({"hidden_size": 0}) is None


def test_model_hidden_size_from_dir_or_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"hidden_size": 7168}}))
    assert model_hidden_size(tmp_path) == 7168
    assert model_hidden_size(tmp_path / "config.json") == 7168


def test_model_hidden_size_says_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no config\.json"):
        model_hidden_size(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        model_hidden_size(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 10}))
    with pytest.raises(ValueError, match=r"neither hidden_size nor text_config\.hidden_size"):
        model_hidden_size(tmp_path)


# --------------------------------------------------------------------------- metadata


def test_metadata_from_a_speculators_data_config(tmp_path: Path) -> None:
    (tmp_path / "data_config.json").write_text(json.dumps({
        "version": "2.0",
        "reproducibility": {"package_versions": {"vllm": "0.16.0", "speculators": "0.3.0"}},
        "model": {"target_model_path": "/m", "hidden_size": 64},
        "data": {"num_samples": 3},
        "hidden_states": {"layer_ids": [2, 5, 8, 11]},
        "format": {"file_pattern": "data_{idx}.pt"},
    }))
    (tmp_path / "sample_lengths.json").write_text(json.dumps({"0": 5, "1": 17}))
    meta = read_metadata(tmp_path)
    assert meta.layer_ids == (2, 5, 8, 11)
    assert meta.hidden_size == 64
    assert meta.model_path == "/m"
    assert meta.package_versions == {"vllm": "0.16.0", "speculators": "0.3.0"}
    assert meta.num_samples == 3
    assert meta.file_pattern == "data_{idx}.pt"
    assert meta.sample_lengths == {0: 5, 1: 17}
    assert meta.problems == ()
    assert "layer_ids [2, 5, 8, 11]" in meta.notes[0]


def test_metadata_read_defensively(tmp_path: Path) -> None:
    assert read_metadata(tmp_path).layer_ids is None  # nothing there
    (tmp_path / "data_config.json").write_text(json.dumps(
        {"hidden_states": {"layer_ids": "2,5"}, "model": "not a mapping"}))
    meta = read_metadata(tmp_path)
    assert meta.layer_ids is None and meta.hidden_size is None and meta.problems == ()
    assert any("not a list of integers" in n for n in meta.notes)
    (tmp_path / "data_config.json").write_text("[1, 2]")
    assert read_metadata(tmp_path).problems == ("data_config.json is not a JSON object",)
    (tmp_path / "data_config.json").write_text('{"trunc')
    assert read_metadata(tmp_path).problems[0].startswith("data_config.json is unreadable")


def test_discover(tmp_path: Path) -> None:
    for name in ("data_10.pt", "data_2.pt", "token_freq.pt", "data_config.json", "hs_1.safetensors",
                 "hidden_states/req-1.safetensors", "hidden_states/req-1.safetensors.lock",
                 "hidden_states/data_0.pt", "other/hs_0.safetensors"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    found = [(s.name, s.format, s.index) for s in discover(tmp_path)]
    assert found == [
        ("data_2.pt", Format.PT, 2),
        ("data_10.pt", Format.PT, 10),
        ("hs_1.safetensors", Format.SAFETENSORS, 1),
        ("hidden_states/req-1.safetensors", Format.SAFETENSORS, None),
    ]


# --------------------------------------------------------------------------- rendering


def hand_made_report() -> VerifyReport:
    return VerifyReport(
        directory=Path("/data/out"),
        files=(
            FileResult("data_0.pt", Format.PT, Status.OK, (), 0, 4, 5, 64, "bfloat16"),
            FileResult("data_1.pt", Format.PT, Status.FAIL,
                       ("771 layers, expected 4", "non-finite values (NaN/inf) in slot 2"),
                       1, 771, 512, None, "bfloat16"),
            FileResult("data_3.pt", Format.PT, Status.FAIL,
                       ("unreadable (empty file): EOFError",), 3),
        ),
        gaps=(Gap("data_{i}.pt", (2,)),),
        notes=("data_config.json: layer_ids [1, 2, 3, 4]",),
        expected=Expected(4, "data_config.json", 64, "--model /m", "bfloat16", "most files"),
    )


def test_table() -> None:
    lines = hand_made_report().render().splitlines()
    assert lines[0] == "speccompat verify /data/out"
    assert lines[1] == "  note: data_config.json: layer_ids [1, 2, 3, 4]"
    assert lines[2] == ("  expected: layers 4 (data_config.json), hidden 64 (--model /m), "
                        "dtype bfloat16 (most files)")
    assert lines[3].split() == ["file", "status", "layers", "rows", "hidden", "dtype", "reason"]
    assert lines[4].split() == ["data_0.pt", "ok", "4", "5", "64", "bfloat16"]
    assert lines[5].split()[:6] == ["data_1.pt", "FAIL", "771", "512", "-", "bfloat16"]
    assert lines[5].endswith("771 layers, expected 4; non-finite values (NaN/inf) in slot 2")
    assert lines[6].split()[:6] == ["data_3.pt", "FAIL", "-", "-", "-", "-"]
    # columns line up: the reason starts at the same offset on every line
    assert lines[3].index("reason") == lines[5].index("771 layers") == lines[6].index("unread")
    assert lines[7] == "MISSING: 1 index missing from data_{i}.pt: data_2.pt"
    assert lines[8] == "total: 3 files, 1 ok, 2 failed, 1 missing: NOT OK"


def test_json() -> None:
    report = hand_made_report()
    payload = json.loads(report.to_json())
    assert payload["ok"] is False
    assert payload["directory"] == "/data/out"
    assert payload["totals"] == {"files": 3, "ok": 1, "failed": 2, "missing": 1}
    assert payload["files"][1] == {
        "file": "data_1.pt", "format": "pt", "index": 1, "status": "fail", "ok": False,
        "reasons": ["771 layers, expected 4", "non-finite values (NaN/inf) in slot 2"],
        "layers": 771, "rows": 512, "hidden": None, "dtype": "bfloat16"}
    assert payload["missing"] == [{"pattern": "data_{i}.pt", "indices": [2],
                                   "files": ["data_2.pt"]}]
    assert payload["expected"]["hidden_from"] == "--model /m"
    assert payload["problems"] == []
    assert payload["notes"] == ["data_config.json: layer_ids [1, 2, 3, 4]"]


def test_ok_needs_files_and_nothing_wrong() -> None:
    good = FileResult("hs_0.safetensors", Format.SAFETENSORS, Status.OK, index=0)
    assert VerifyReport(Path("d"), files=(good,)).ok
    assert not VerifyReport(Path("d")).ok  # nothing to check is a failure
    assert not VerifyReport(Path("d"), files=(good,), gaps=(Gap("hs_{i}.safetensors", (1,)),)).ok
    assert not VerifyReport(Path("d"), files=(good,), problems=("data_config.json ...",)).ok
    empty = VerifyReport(Path("d"), problems=("d does not exist",)).render().splitlines()
    assert empty[-2:] == ["PROBLEM: d does not exist",
                          "total: 0 files, 0 ok, 0 failed, 0 missing: NOT OK"]
    assert "expected: layers unknown, hidden unknown, dtype unknown" in empty[1]


# --------------------------------------------------------------------------- the CLI


@pytest.mark.skipif(TORCH_IMPORTABLE, reason="torch is importable here")
@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_cli_without_torch(tmp_path: Path, extra: list[str],
                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "data_0.pt").write_bytes(b"")
    assert cli.main(["verify", str(tmp_path), *extra]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: `speccompat verify` needs torch")
    assert "No module named 'torch'" in captured.err


def test_cli_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["verify", "--help"])
    assert caught.value.code == 0
    out = capsys.readouterr().out
    assert " ".join(out.split()).startswith("usage: speccompat verify [-h] [--model MODEL_DIR] "
                                            "[--layer-ids ID [ID ...]] [--json] DIR")
    with pytest.raises(SystemExit) as caught:
        cli.main(["verify"])
    assert caught.value.code == 2


def test_the_seed_bug_message_names_a_catalogued_adapter() -> None:
    import speccompat
    from speccompat import verify

    assert verify.SEED_BUG_ADAPTER in {a.id for a in speccompat.catalogue()}
