"""Array dispatch: kinds, devices, conversion back, and the no-GPU answers."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from protgpu import _array
from protgpu.errors import GPUUnavailableError, InputError


def test_numpy_kind_and_cpu_device():
    be = _array.dispatch(np.zeros(3), device="cpu")
    assert (be.kind, be.device, be.xp) == ("numpy", "cpu", np)
    assert isinstance(be.wrap(np.ones(2)), np.ndarray)


def test_lists_and_none_are_numpy():
    assert _array.dispatch([1, 2], None, device="cpu").kind == "numpy"
    assert _array.array_kind([[1.0, 2.0]]) == "numpy"


def test_unknown_device_is_an_error():
    with pytest.raises(InputError, match="device must be one of"):
        _array.dispatch(np.zeros(3), device="cuda")


def test_gpu_without_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(_array, "gpu_available", lambda: False)
    with pytest.raises(GPUUnavailableError, match="no GPU is usable"):
        _array.dispatch(np.zeros(3), device="gpu")
    assert _array.dispatch(np.zeros(3), device="auto").device == "cpu"


def test_disable_env_answers_quickly_in_a_fresh_process():
    code = ("import os, time; os.environ['PROTGPU_DISABLE_GPU']='1'; t=time.time();"
            "from protgpu._array import gpu_available, gpu_unavailable_reason;"
            "print(gpu_available(), gpu_unavailable_reason(), round(time.time()-t, 3))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("False PROTGPU_DISABLE_GPU is set")


def test_no_driver_answer_is_quick_and_has_a_reason():
    # Fresh process: on a machine without a driver this must answer False with a reason, at once.
    code = ("import time; t=time.time(); from protgpu._array import gpu_available, gpu_unavailable_reason;"
            "ok=gpu_available(); print(ok, time.time()-t < 10, gpu_unavailable_reason() is None or "
            "len(gpu_unavailable_reason()) > 5)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split()[1:] == ["True", "True"]


def test_wrap_keeps_named_tuples_and_dicts():
    from collections import namedtuple

    be = _array.Backend("numpy", "cpu")
    Pair = namedtuple("Pair", "a b")
    r = be.wrap(Pair(np.zeros(1), 3))
    assert isinstance(r, Pair) and r.b == 3
    assert set(be.wrap({"x": np.zeros(2)})) == {"x"}
