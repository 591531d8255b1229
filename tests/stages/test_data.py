"""The dataset contract: the (x, y) form and the v2 form with named inputs and optional
labels, each input validated with errors naming the split, the input and the sample."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from schemas.errors import StageError
from stages import data as data_mod
from stages import resident
from stages.data import load_splits
from tests.models import data as tiny_data

HERE = "tests.stages.test_data"
X = np.zeros((8, 3), np.float64)


def v2_ints() -> dict:
    """Token ids and a bool mask, no labels: any numeric dtype is an input."""
    ids, mask = np.arange(24).reshape(8, 3), np.ones((8, 3), bool)
    split = {"inputs": {"mask": mask, "ids": ids}, "labels": None}
    return {"train": split, "evaluation": split}


def pairs() -> dict:
    return {"train": (X, np.zeros(8, np.int32)), "evaluation": (X, np.arange(8))}


def ragged() -> dict:
    samples = [np.zeros(3, np.float32)] * 5 + [np.zeros(4, np.float32)] + [np.zeros(3)] * 2
    return {"train": (X, None), "evaluation": {"inputs": {"x": samples}, "labels": None}}


def strings() -> dict:
    return {"train": (X, None), "evaluation": {"inputs": {"x": np.array(["a"] * 8)}}}


def extra_key() -> dict:
    return {"train": (X, None), "evaluation": {"inputs": {"x": X}, "label": np.arange(8)}}


def test_v2_inputs_keep_integers_follow_the_parameter_order_and_may_have_no_labels():
    s = load_splits(f"{HERE}:v2_ints", 4, 4, ["ids", "mask"])["evaluation"]
    assert list(s.inputs) == ["ids", "mask"] and s.labels is None and len(s) == 4
    assert s.inputs["ids"].dtype == np.int64 and s.inputs["mask"].dtype == np.int64
    assert [y for _, _, y in s.batches(2)] == [None, None]


def test_the_pair_form_names_its_input_after_the_forward_parameter():
    s = load_splits(f"{HERE}:pairs", 8, 8, ["image"])
    assert list(s["evaluation"].inputs) == ["image"] and s["evaluation"].x.dtype == np.float32
    assert s["calibration"].labels.dtype == np.int64


def test_a_large_split_is_file_backed_with_the_same_values_digest_and_batches(
    tmp_path, monkeypatch
):
    """A split past FILE_BACKED_BYTES lives in a file mapping (a run's 1000 frames are not
    the process's own memory between batches); a small one stays in memory."""
    x, y = tiny_data()["evaluation"]
    before = load_splits("tests.models:data", 8, 64)
    monkeypatch.setattr(data_mod, "FILE_BACKED_BYTES", 8 * x[0].nbytes)
    after = load_splits("tests.models:data", 8, 64, folder=tmp_path)
    ev = after["evaluation"]
    assert resident.is_file_backed(ev.x) and not resident.is_file_backed(after["calibration"].x)
    assert np.array_equal(ev.x, before["evaluation"].x) and np.array_equal(ev.y, y[:64])
    assert ev.digest == before["evaluation"].digest
    got = [(s, xb.numpy().copy()) for s, xb, _ in ev.batches(16)]
    assert [s for s, _ in got] == [0, 16, 32, 48]
    assert np.array_equal(np.concatenate([b for _, b in got]), before["evaluation"].x)
    assert list(tmp_path.iterdir()) == []


def test_a_file_backed_digest_reads_a_chunk_at_a_time_and_hashes_the_same(tmp_path, monkeypatch):
    """Hashed whole, a file-backed split's pages were all resident at once (MobileNetV2's
    1000 frames: 0.6 GB, the run's peak); hashed in chunks with the pages dropped between
    them, the peak grows by about one chunk, and the digest is the whole buffer's."""
    x = np.arange(128 * 2**18, dtype=np.float32).reshape(128, 2**18)  # 128 MB
    want = hashlib.sha256(str((x.dtype, x.shape)).encode() + x.tobytes()).hexdigest()
    split = data_mod.Split("evaluation", {"x": resident.file_backed(x, tmp_path)})
    del x
    monkeypatch.setattr(data_mod, "DIGEST_BYTES", 8 * 2**20)
    resident.drop_mapped()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    except OSError:
        pytest.skip("this kernel does not let a process reset its peak RSS")
    before = _status_mb("VmRSS")
    assert split.digest == want
    assert _status_mb("VmHWM") - before < 48, "the digest held the whole split resident"


def _status_mb(field: str) -> float:
    text = Path("/proc/self/status").read_text()
    return int(text.split(f"{field}:")[1].split()[0]) / 1024


F32 = np.zeros((8, 3), np.float32)


def float32s() -> dict:
    return {"train": (F32, None), "evaluation": (F32, None)}


def test_a_float32_input_is_used_as_the_dataset_gave_it_not_copied():
    """A run held a 1000-frame split twice while it loaded (the dataset's array and its
    float32 copy); a float32 input needs no copy."""
    s = load_splits(f"{HERE}:float32s", 8, 8)
    assert np.shares_memory(s["evaluation"].x, F32) and s["evaluation"].x.dtype == np.float32


def test_the_pair_form_digest_is_unchanged():
    """Cache keys of existing datasets stay valid: x then y, as before the v2 form."""
    x, y = tiny_data()["evaluation"]
    s = load_splits("tests.models:data", 64, 64)["evaluation"]
    h = hashlib.sha256()
    for a in (x.astype(np.float32), y.astype(np.int64)):
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes())
    assert s.digest == h.hexdigest()


@pytest.mark.parametrize(
    ("fn", "names", "where", "says"),
    [("v2_ints", ["ids"], "data.train.inputs", "an input 'mask'"),
     ("v2_ints", ["ids", "mask", "pos"], "data.train.inputs", "no input 'pos'"),
     ("ragged", None, "data.evaluation.inputs.x[5]", "sample 5 of input 'x'"),
     ("strings", None, "data.evaluation.inputs.x", "<U1, not numeric"),
     ("extra_key", None, "data.evaluation", "'label' is not one")],
)  # fmt: skip
def test_bad_inputs_name_the_split_the_input_and_the_sample(fn, names, where, says):
    with pytest.raises(StageError) as e:
        load_splits(f"{HERE}:{fn}", 4, 4, names)
    assert e.value.where == where and says in e.value.message
