"""The devices ggml finds at run time, and a model on a Vulkan device against the same model on
the CPU. The Vulkan test runs wherever a Vulkan build finds a device: a GPU, or on a machine
without one Mesa's CPU driver (lavapipe), which ggml takes only when asked for by index:
GGML_VK_VISIBLE_DEVICES=0."""

from __future__ import annotations

import pytest

from uma import _core

from ..helpers import assert_same_greedy
from .test_decode import PROMPTS, greedy_alone


def vulkan_devices():
    return [d for d in _core.devices() if d["backend"] == "Vulkan"]


def test_devices_name_the_cpu_and_only_compiled_backends():
    devices = _core.devices()
    assert any(d["type"] == "cpu" for d in devices)
    for d in devices:
        assert d["name"] and d["type"] in ("cpu", "gpu", "igpu", "accel", "meta", "other")
        assert d["backend"].lower() in _core.backends(), d
        assert 0 <= d["memory_free"] <= d["memory_total"] or d["memory_total"] == 0


@pytest.mark.skipif("vulkan" not in _core.backends(), reason="not a Vulkan build")
@pytest.mark.skipif(not vulkan_devices(), reason="no Vulkan device (for a CPU one: apt install "
                    "mesa-vulkan-drivers and set GGML_VK_VISIBLE_DEVICES=0)")
def test_a_model_on_the_vulkan_device_decodes_as_on_the_cpu(tiny_path):
    on_device = _core.Model(tiny_path, n_gpu_layers=-1)
    on_cpu = _core.Model(tiny_path, n_gpu_layers=0)
    try:
        for prompt in PROMPTS[:4]:
            tokens = on_cpu.tokenize(prompt)
            expected, expected_lps = greedy_alone(on_cpu, tokens, 12)
            got, got_lps = greedy_alone(on_device, tokens, 12)
            assert_same_greedy(expected, got, expected_lps, got_lps)
    finally:
        on_device.close()
        on_cpu.close()
