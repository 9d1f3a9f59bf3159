"""``python -m speccompat verify``: real files written with torch / safetensors, good and bad.

The good layouts are written the way speculators 0.3/0.4 (``torch.save`` of one dict
per sample, plus ``data_config.json``) and vLLM's ExampleHiddenStatesConnector
(``save_file`` of ``hidden_states`` ``[tokens, layers, hidden]`` and ``token_ids``)
write them; each corrupted variant must fail, naming the file and the problem.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from speccompat import cli  # noqa: E402
from speccompat.verify import SEED_BUG_ADAPTER, Status, verify_dir  # noqa: E402

HIDDEN = 64
LAYER_IDS = [1, 2, 3, 4]  # what a 4-layer capture records; values are arbitrary here
LENGTHS = [5, 17, 9]


# --------------------------------------------------------------------------- writers


def write_model(path: Path, hidden: int, *, nested: bool = False) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"model_type": "llama", "num_hidden_layers": 4}
    if nested:
        config["text_config"] = {"hidden_size": hidden}
    else:
        config["hidden_size"] = hidden
    (path / "config.json").write_text(json.dumps(config))
    return path


def data_config(layer_ids: list[int], hidden: int, num_samples: int) -> dict[str, Any]:
    """What speculators 0.3.0's DataGenerationConfig.to_dict() writes (abridged values)."""
    return {
        "version": "2.0",
        "generated_at": "2025-01-01T00:00:00+00:00",
        "speculators_version": "0.3.0",
        "reproducibility": {
            "command": "data_generation_offline.py",
            "package_versions": {"torch": "2.10.0", "vllm": "0.16.0",
                                 "transformers": "4.57.0", "speculators": "0.3.0"},
            "gpu": "CPU only",
        },
        "model": {"target_model_path": "/models/tiny", "tensor_parallel_size": 1,
                  "gpu_memory_utilization": 0.8, "hidden_size": hidden},
        "data": {"train_data_path": "sharegpt", "seq_length": 64, "max_samples": None,
                 "num_samples": num_samples, "seed": 0},
        "hidden_states": {"layer_ids": layer_ids, "description": "..."},
        "generation": {"cache_dir": "/tmp"},
        "format": {"file_pattern": "data_{idx}.pt", "data_format_version": 1, "schema": {}},
    }


def make_sample(rows: int, *, layers: int = len(LAYER_IDS), hidden: int = HIDDEN,
                dtype: Any = None, seed: int = 0) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.bfloat16
    return {
        "input_ids": torch.randint(0, 1000, (rows,), generator=generator, dtype=torch.long),
        # layer i holds the value i (plus noise): an order or offset bug would show
        "hidden_states": [(torch.randn(rows, hidden, generator=generator) + i).to(dtype)
                          for i in range(layers)],
        "loss_mask": torch.ones(rows, dtype=torch.long),
    }


def write_pt_dir(path: Path, lengths: list[int] = LENGTHS, *, hidden: int = HIDDEN,
                 config: bool = True, indices: list[int] | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    indices = list(range(len(lengths))) if indices is None else indices
    for index, rows in zip(indices, lengths, strict=True):
        torch.save(make_sample(rows, hidden=hidden, seed=index), path / f"data_{index}.pt")
    if config:
        (path / "data_config.json").write_text(
            json.dumps(data_config(LAYER_IDS, hidden, len(lengths)), indent=2))
    return path


def write_safetensors_dir(path: Path, lengths: list[int] = LENGTHS, *,
                          names: list[str] | None = None) -> Path:
    save_file = pytest.importorskip("safetensors.torch").save_file
    names = names or [f"hs_{i}.safetensors" for i in range(len(lengths))]
    for seed, (name, rows) in enumerate(zip(names, lengths, strict=True)):
        sample = make_sample(rows, seed=seed)
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        save_file({"hidden_states": torch.stack(sample["hidden_states"], dim=1).contiguous(),
                   "token_ids": sample["input_ids"]}, str(path / name))
    return path


def verify(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(["verify", *args])
    return code, capsys.readouterr().out


def verify_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out = verify(capsys, *args, "--json")
    return code, json.loads(out)


def line_of(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(name + " "))


def only_failure(payload: dict[str, Any]) -> dict[str, Any]:
    failed = [f for f in payload["files"] if not f["ok"]]
    assert len(failed) == 1, failed
    return failed[0]


# --------------------------------------------------------------------------- good outputs


def test_good_pt_dir_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_pt_dir(tmp_path / "out")
    model = write_model(tmp_path / "model", HIDDEN)
    code, out = verify(capsys, str(data), "--model", str(model))
    assert code == 0, out
    for index, rows in enumerate(LENGTHS):
        assert line_of(out, f"data_{index}.pt").split() == [
            f"data_{index}.pt", "ok", "4", str(rows), str(HIDDEN), "bfloat16"]
    assert "len(hidden_states.layer_ids) in data_config.json" in out
    assert f"--model {model}" in out
    assert "vllm 0.16.0" in out and "speculators 0.3.0" in out
    assert out.splitlines()[-1] == "total: 3 files, 3 ok, 0 failed, 0 missing: OK"

    code, payload = verify_json(capsys, str(data), "--model", str(model))
    assert code == 0
    assert payload["ok"] is True
    assert payload["totals"] == {"files": 3, "ok": 3, "failed": 0, "missing": 0}
    assert payload["expected"]["layers"] == 4 and payload["expected"]["hidden"] == HIDDEN
    assert [f["file"] for f in payload["files"]] == ["data_0.pt", "data_1.pt", "data_2.pt"]
    assert [f["rows"] for f in payload["files"]] == LENGTHS
    assert payload["missing"] == [] and payload["problems"] == []


def test_good_pt_dir_without_metadata_or_model(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    data = write_pt_dir(tmp_path / "out", config=False)
    code, payload = verify_json(capsys, str(data))
    assert code == 0, payload
    assert payload["expected"]["layers_from"] == payload["expected"]["hidden_from"] == "most files"


def test_model_hidden_size_from_text_config(tmp_path: Path) -> None:
    data = write_pt_dir(tmp_path / "out")
    report = verify_dir(data, model=write_model(tmp_path / "model", HIDDEN, nested=True))
    assert report.ok, report.render()


def test_module_entry_point(tmp_path: Path) -> None:
    data = write_pt_dir(tmp_path / "out")
    model = write_model(tmp_path / "model", HIDDEN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECCOMPAT_")}
    result = subprocess.run(
        [sys.executable, "-m", "speccompat", "verify", str(data), "--model", str(model)],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].endswith(": OK")


def test_good_safetensors_dir_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_safetensors_dir(tmp_path / "out")
    model = write_model(tmp_path / "model", HIDDEN)
    code, payload = verify_json(capsys, str(data), "--model", str(model))
    assert code == 0, payload
    assert [(f["file"], f["format"], f["layers"], f["rows"], f["hidden"], f["dtype"])
            for f in payload["files"]] == [
        (f"hs_{i}.safetensors", "safetensors", 4, rows, HIDDEN, "bfloat16")
        for i, rows in enumerate(LENGTHS)]


def test_unordered_recorded_ids_count_as_their_slots(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Ids recorded as [4, 0, 2, 2, 3] give 4 slots, ids 0, 2, 3, 4 in layer order (what
    every release writes through speccompat): the files pass, a note says how the slots read,
    and a copied slot is named by its id in that order."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    data = write_safetensors_dir(tmp_path / "out")
    (data / "data_config.json").write_text(json.dumps(data_config([4, 0, 2, 2, 3], HIDDEN, 3)))
    code, out = verify(capsys, str(data))
    assert code == 0, out
    assert "the files hold each id once in layer order: ids [0, 2, 3, 4]" in out
    assert "the distinct hidden_states.layer_ids in data_config.json" in out
    states = torch.randn(6, 4, HIDDEN).to(torch.bfloat16)
    states[:, 2] = states[:, 1]
    save_file({"hidden_states": states, "token_ids": torch.arange(6)},
              str(data / "hs_0.safetensors"))
    code, payload = verify_json(capsys, str(data))
    assert code == 1
    (reason,) = only_failure(payload)["reasons"]
    assert "slots 1 (id 2) and 2 (id 3)" in reason, reason


def test_connector_request_files_under_hidden_states(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    names = ["hidden_states/req-a.safetensors", "hidden_states/req-b.safetensors"]
    data = write_safetensors_dir(tmp_path / "out", LENGTHS[:2], names=names)
    (data / "hidden_states" / "req-a.safetensors.lock").write_text("")
    code, payload = verify_json(capsys, str(data))
    assert code == 0, payload
    assert [f["file"] for f in payload["files"]] == names


# --------------------------------------------------------------------------- corrupted outputs


def test_seed_bug_signature(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """speculators 0.3.0 on vLLM >= 0.11.1, unpatched: 771 tensors [512], not 4 [512, 7168]."""
    data = tmp_path / "out"
    data.mkdir()
    (data / "data_config.json").write_text(json.dumps(data_config([2, 30, 57, 60], 7168, 1)))
    torch.save({"input_ids": torch.arange(512),
                "hidden_states": [torch.randn(512).to(torch.bfloat16) for _ in range(771)],
                "loss_mask": torch.ones(512, dtype=torch.long)}, data / "data_0.pt")
    model = write_model(tmp_path / "kimi", 7168)
    code, out = verify(capsys, str(data), "--model", str(model))
    assert code == 1, out
    line = line_of(out, "data_0.pt")
    assert line.split()[:3] == ["data_0.pt", "FAIL", "771"]
    assert "771 layers, expected 4 (len(hidden_states.layer_ids) in data_config.json)" in line
    assert "hidden_states: no item is 2-D [rows, hidden] (found 771 x [512])" in line
    assert SEED_BUG_ADAPTER in line
    assert out.splitlines()[-1] == "total: 1 files, 0 ok, 1 failed, 0 missing: NOT OK"


def test_truncated_pt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_pt_dir(tmp_path / "out")
    victim = data / "data_1.pt"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    code, out = verify(capsys, str(data))
    assert code == 1
    line = line_of(out, "data_1.pt")
    assert "FAIL" in line
    assert "unreadable (truncated: a zip archive without its central directory" in line
    assert "Error: " in line  # torch's own error is named too
    assert line_of(out, "data_0.pt").split()[1] == "ok"
    assert line_of(out, "data_2.pt").split()[1] == "ok"


def test_nan_in_one_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_pt_dir(tmp_path / "out")
    sample = make_sample(LENGTHS[2], seed=2)
    sample["hidden_states"][2][3, 5] = float("nan")
    sample["hidden_states"][2][4, 0] = float("inf")
    torch.save(sample, data / "data_2.pt")
    code, payload = verify_json(capsys, str(data))
    assert code == 1
    failure = only_failure(payload)
    assert failure["file"] == "data_2.pt"
    assert failure["reasons"] == ["non-finite values (NaN/inf) in slot 2 (id 3) (2 values)"]


def test_missing_index(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_pt_dir(tmp_path / "out", [5, 9], indices=[0, 2])
    code, out = verify(capsys, str(data))
    assert code == 1
    assert "MISSING: 1 index missing from data_{i}.pt: data_1.pt" in out
    assert out.splitlines()[-1] == "total: 2 files, 2 ok, 0 failed, 1 missing: NOT OK"
    code, payload = verify_json(capsys, str(data))
    assert payload["missing"] == [{"pattern": "data_{i}.pt", "indices": [1],
                                   "files": ["data_1.pt"]}]
    assert payload["ok"] is False


def test_wrong_hidden_size_for_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_pt_dir(tmp_path / "out")
    model = write_model(tmp_path / "model", 128)
    code, payload = verify_json(capsys, str(data), "--model", str(model))
    assert code == 1
    assert payload["totals"]["failed"] == 3
    for result in payload["files"]:
        assert f"hidden size {HIDDEN}, expected 128 (--model {model})" in result["reasons"]
    assert any("records hidden_size 64, but --model says 128" in n for n in payload["notes"])


def test_rows_differ_from_input_ids(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_pt_dir(tmp_path / "out")
    sample = make_sample(10, seed=1)
    sample["hidden_states"][3] = sample["hidden_states"][3][:9]
    torch.save(sample, data / "data_1.pt")
    code, payload = verify_json(capsys, str(data))
    assert code == 1
    failure = only_failure(payload)
    assert failure["file"] == "data_1.pt"
    assert failure["reasons"] == ["slot 3 (id 4) has 9 rows, but input_ids has 10"]


def test_loss_mask_wrong_length(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_pt_dir(tmp_path / "out")
    sample = make_sample(LENGTHS[0], seed=0)
    sample["loss_mask"] = torch.ones(LENGTHS[0] + 3, dtype=torch.long)
    torch.save(sample, data / "data_0.pt")
    code, payload = verify_json(capsys, str(data))
    assert code == 1
    failure = only_failure(payload)
    assert failure["reasons"] == [f"loss_mask has {LENGTHS[0] + 3} entries, but input_ids "
                                  f"has {LENGTHS[0]}"]


def test_loss_mask_none_is_fine(tmp_path: Path) -> None:
    data = write_pt_dir(tmp_path / "out")
    sample = make_sample(LENGTHS[0], seed=0)
    sample["loss_mask"] = None
    torch.save(sample, data / "data_0.pt")
    assert verify_dir(data).ok


def test_dtype_differs_across_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_pt_dir(tmp_path / "out")
    torch.save(make_sample(LENGTHS[1], seed=1, dtype=torch.float16), data / "data_1.pt")
    code, payload = verify_json(capsys, str(data))
    assert code == 1
    assert only_failure(payload)["reasons"] == ["dtype float16, but most files are bfloat16"]


class Payload:
    """Pickles as a call to ``_touch``: loading it unsafely would create ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (_touch, (self.marker,))


class PlainObject:
    def __init__(self) -> None:
        self.value = 1


def _touch(path: str) -> None:
    Path(path).write_text("executed")


@pytest.mark.parametrize("kind", ["reduce", "plain"])
def test_pickle_needing_more_than_weights_only(tmp_path: Path, kind: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    data = write_pt_dir(tmp_path / "out")
    marker = tmp_path / "executed"
    sample = make_sample(LENGTHS[0], seed=0)
    sample["extra"] = Payload(marker) if kind == "reduce" else PlainObject()
    torch.save(sample, data / "data_0.pt")
    code, out = verify(capsys, str(data))
    assert code == 1
    line = line_of(out, "data_0.pt")
    assert "refused: not loadable with torch.load(weights_only=True)" in line
    assert ("_touch" if kind == "reduce" else "PlainObject") in line
    assert "not unpickled" in line
    assert not marker.exists(), "verify executed a pickle"


def test_truncated_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_safetensors_dir(tmp_path / "out")
    victim = data / "hs_0.safetensors"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    (data / "hs_2.safetensors").unlink()
    (data / "hs_3.safetensors").write_bytes((data / "hs_1.safetensors").read_bytes())
    code, out = verify(capsys, str(data))
    assert code == 1
    assert "unreadable (truncated or corrupt)" in line_of(out, "hs_0.safetensors")
    assert "MISSING: 1 index missing from hs_{i}.safetensors: hs_2.safetensors" in out


def test_safetensors_wrong_layer_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_file = pytest.importorskip("safetensors.torch").save_file
    data = write_safetensors_dir(tmp_path / "out")
    save_file({"hidden_states": torch.randn(7, 3, HIDDEN).to(torch.bfloat16),
               "token_ids": torch.arange(7)}, str(data / "hs_1.safetensors"))
    code, payload = verify_json(capsys, str(data))
    assert code == 1
    assert only_failure(payload)["reasons"] == ["3 layers, expected 4 (most files)"]


def test_safetensors_all_zero_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Rows nobody wrote (vLLM 0.22-0.24's connector on hybrid models reads unwritten
    cache slots): flagged per layer with their count, in data written before speccompat."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    data = write_safetensors_dir(tmp_path / "out")
    states = torch.randn(9, 4, HIDDEN).to(torch.bfloat16)
    states[2:5, 1] = 0
    states[7, 3] = 0
    save_file({"hidden_states": states, "token_ids": torch.arange(9)},
              str(data / "hs_2.safetensors"))
    code, payload = verify_json(capsys, str(data))
    assert code == 1
    (reason,) = only_failure(payload)["reasons"]
    assert reason.startswith("all-zero rows (tokens whose state is exactly 0) in slot 1: 3 "
                             "of 9; slot 3: 1 of 9")


def test_safetensors_zero_rows_counted_per_file(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """How many tokens and layers, per file: a whole zero layer in one file, scattered rows
    in another (what the H200 saw on vLLM 0.24: most rows of a file zero)."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    data = write_safetensors_dir(tmp_path / "out")
    states = torch.randn(6, 4, HIDDEN).to(torch.bfloat16)
    states[:, 2] = 0
    save_file({"hidden_states": states, "token_ids": torch.arange(6)},
              str(data / "hs_0.safetensors"))
    states = torch.randn(8, 4, HIDDEN).to(torch.bfloat16)
    states[1:6] = 0
    save_file({"hidden_states": states, "token_ids": torch.arange(8)},
              str(data / "hs_1.safetensors"))
    code, payload = verify_json(capsys, str(data))
    assert code == 1
    reasons = {f["file"]: f["reasons"] for f in payload["files"] if not f["ok"]}
    assert reasons["hs_0.safetensors"] == [
        "all-zero rows (tokens whose state is exactly 0) in slot 2: 6 of 6 (the whole slot) "
        "(6 of 6 tokens, 1 of 4 slots): states nobody wrote, not a model's output"]
    (zeros,) = reasons["hs_1.safetensors"]
    assert zeros.startswith("all-zero rows (tokens whose state is exactly 0) in slot 0: 5 of "
                            "8; slot 1: 5 of 8; slot 2: 5 of 8; slot 3: 5 of 8 (5 of 8 "
                            "tokens, 4 of 4 slots)")
    assert payload["totals"]["failed"] == 2


def test_safetensors_copied_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """What vLLM 0.26 writes for an id its model cannot serve: another id's state again."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    data = write_safetensors_dir(tmp_path / "out")
    states = torch.randn(6, 4, HIDDEN).to(torch.bfloat16)
    states[:, 3] = states[:, 1]
    save_file({"hidden_states": states, "token_ids": torch.arange(6)},
              str(data / "hs_0.safetensors"))
    code, payload = verify_json(capsys, str(data))
    assert code == 1
    (reason,) = only_failure(payload)["reasons"]
    assert reason.startswith("layer slots 1 and 3 hold identical states for every token")


def test_safetensors_id_0_slot_aliased(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """What an --enforce-eager CUDA server of vLLM >= 0.18 writes without
    vllm.eagle_mixin_capture_alias (seen on an H200 with vLLM 0.26.0): id 0's slot holds the
    final pre-norm state, equal to the last slot in every digit."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    data = write_safetensors_dir(tmp_path / "out")
    states = torch.randn(6, 4, HIDDEN).to(torch.bfloat16)
    states[:, 0] = states[:, 3]
    save_file({"hidden_states": states, "token_ids": torch.arange(6)},
              str(data / "hs_0.safetensors"))
    model = write_model(tmp_path / "model", HIDDEN)
    code, payload = verify_json(capsys, str(data), "--model", str(model))
    assert code == 1
    (reason,) = only_failure(payload)["reasons"]
    assert reason.startswith("layer slot 0, the embeddings (where slot 0 is id 0), holds the "
                             "same states as slot 3 for every token")
    assert "--enforce-eager" in reason and "vllm.eagle_mixin_capture_alias" in reason


def write_model_with_embeddings(path: Path, *, model_type: str = "llama", vocab: int = 1000,
                                **config: Any) -> Any:
    """A model folder whose model.safetensors holds only ``model.embed_tokens.weight``."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    write_model(path, HIDDEN)
    (path / "config.json").write_text(json.dumps(
        {"model_type": model_type, "num_hidden_layers": 4, "hidden_size": HIDDEN, **config}))
    embed = torch.randn(vocab, HIDDEN, generator=torch.Generator().manual_seed(5))
    embed = embed.to(torch.bfloat16)
    save_file({"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(HIDDEN)},
              str(path / "model.safetensors"))
    return embed


def write_first_id_files(path: Path, embed: Any, *, dtype: Any = None) -> Path:
    """Files as a server asked for ids [0, 1, 2, 3] writes them: slot 0 the token rows."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    path.mkdir(parents=True, exist_ok=True)
    dtype = dtype or torch.bfloat16
    for index, rows in enumerate(LENGTHS):
        generator = torch.Generator().manual_seed(index)
        tokens = torch.randint(0, embed.shape[0], (rows,), generator=generator)
        states = torch.randn(rows, 4, HIDDEN, generator=generator).to(dtype)
        states[:, 0] = embed[tokens].to(dtype)
        save_file({"hidden_states": states, "token_ids": tokens},
                  str(path / f"hs_{index}.safetensors"))
    return path


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_id_0_equal_to_the_model_embeddings_passes(tmp_path: Path, dtype: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Ids given in any order: id 0 is slot 0. A float32 server (--dtype float32) casts the
    bf16 rows exactly, so they compare bit for bit too."""
    embed = write_model_with_embeddings(tmp_path / "model")
    data = write_first_id_files(tmp_path / "out", embed, dtype=getattr(torch, dtype))
    code, out = verify(capsys, str(data), "--model", str(tmp_path / "model"),
                       "--layer-ids", "3", "0", "2", "1")
    assert code == 0, out
    assert "id 0 compared with" in out and "model.embed_tokens.weight" in out
    # --model may name the config file itself.
    code, out = verify(capsys, str(data), "--model", str(tmp_path / "model" / "config.json"),
                       "--layer-ids", "0", "1", "2", "3")
    assert code == 0 and "id 0 compared with" in out, out


def test_id_0_holding_the_first_layers_update_fails(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """What an eager Kimi-Linear server of vLLM 0.27+ writes without speccompat (seen on an
    H200 with vLLM 0.34.0): id 0 is the embeddings plus the first layer's in-place update.
    Shape, dtype and values look fine; only the embeddings tell."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    embed = write_model_with_embeddings(tmp_path / "model")
    data = write_first_id_files(tmp_path / "out", embed)
    path = str(data / "hs_1.safetensors")
    from safetensors.torch import load_file

    sample = load_file(path)
    sample["hidden_states"][:, 0] += torch.randn(LENGTHS[1], HIDDEN).to(torch.bfloat16)
    save_file(sample, path)
    code, payload = verify_json(capsys, str(data), "--model", str(tmp_path / "model"),
                                "--layer-ids", "0", "1", "2", "3")
    assert code == 1
    failed = only_failure(payload)
    assert failed["file"] == "hs_1.safetensors"
    (reason,) = failed["reasons"]
    assert reason.startswith("id 0 is not the model's embeddings (model.embed_tokens.weight) "
                             f"for {LENGTHS[1]} of {LENGTHS[1]} tokens"), reason


def test_id_0_not_compared_where_the_model_may_scale_its_embeddings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    embed = write_model_with_embeddings(tmp_path / "model", model_type="gemma3_text")
    data = write_first_id_files(tmp_path / "out", embed * 2)  # Gemma's normalizer
    code, out = verify(capsys, str(data), "--model", str(tmp_path / "model"),
                       "--layer-ids", "0", "1", "2", "3")
    assert code == 0, out
    assert "id 0 not compared with the model's embeddings: model_type 'gemma3_text'" in out


def test_id_0_not_compared_without_the_embeddings_in_the_model_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = write_safetensors_dir(tmp_path / "out")
    model = write_model(tmp_path / "model", HIDDEN)  # config.json only
    code, out = verify(capsys, str(data), "--model", str(model), "--layer-ids", "0", "1", "2",
                       "3")
    assert code == 0, out
    assert ("id 0 not compared with the model's embeddings: no *embed_tokens.weight tensor in "
            f"{model}'s safetensors files") in out


def test_id_0_skips_media_placeholders_and_names_unknown_tokens(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A multimodal model replaces its image placeholder's rows before layer 0; a token past
    the vocabulary cannot be the model's."""
    save_file = pytest.importorskip("safetensors.torch").save_file
    embed = write_model_with_embeddings(tmp_path / "model", image_token_id=7)
    data = write_first_id_files(tmp_path / "out", embed)
    sample = {"hidden_states": torch.randn(3, 4, HIDDEN).to(torch.bfloat16),
              "token_ids": torch.tensor([7, 3, 7])}
    sample["hidden_states"][1, 0] = embed[3]
    save_file(sample, str(data / "hs_0.safetensors"))
    model = ["--model", str(tmp_path / "model"), "--layer-ids", "0", "1", "2", "3"]
    code, out = verify(capsys, str(data), *model)
    assert code == 0, out
    sample["token_ids"] = torch.tensor([7, 3, 1000])
    save_file(sample, str(data / "hs_0.safetensors"))
    code, payload = verify_json(capsys, str(data), *model)
    assert code == 1
    (reason,) = only_failure(payload)["reasons"]
    assert reason == "token id 1000 is outside model.embed_tokens.weight's 1000 rows"


def test_pt_copied_layer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The old generator's files (id k = the output of layer k: no slot is the embeddings)."""
    data = write_pt_dir(tmp_path / "out")
    sample = make_sample(LENGTHS[0])
    sample["hidden_states"][0] = sample["hidden_states"][2].clone()
    torch.save(sample, data / "data_0.pt")
    code, payload = verify_json(capsys, str(data))
    assert code == 1
    (reason,) = only_failure(payload)["reasons"]
    assert reason.startswith("layer slots 0 (id 1) and 2 (id 3) hold identical states for "
                             "every token")


@pytest.mark.parametrize("make", ["empty", "nonexistent"])
def test_nothing_to_check_fails(tmp_path: Path, make: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "out"
    if make == "empty":
        data.mkdir()
    code, out = verify(capsys, str(data))
    assert code == 1
    expected = "no hidden-state files in" if make == "empty" else "does not exist"
    assert f"PROBLEM: {data} {expected}" in out or expected in out
    assert out.splitlines()[-1].endswith("NOT OK")


def test_reports_status_enum(tmp_path: Path) -> None:
    data = write_pt_dir(tmp_path / "out", [4], indices=[0])
    report = verify_dir(data)
    assert [f.status for f in report.files] == [Status.OK]
