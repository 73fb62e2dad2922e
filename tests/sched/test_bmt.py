"""ΣBMT: bytes a tick moves, from the model file's shape."""

from uma import _core, synth
from uma.sched.bmt import BmtModel

MOE = synth.PRESETS["tiny-moe"]


def test_an_moe_reads_the_experts_its_tokens_reach_at_their_real_width(tiny_moe_path):
    with _core.Model(tiny_moe_path) as m:
        bmt = BmtModel.of(m)
        size = m.info()["size_bytes"]
    # three f32 matrices (gate, up, down) of n_embd × n_ff per layer make one expert
    expert = 3 * MOE.n_embd * MOE.n_ff * MOE.n_layer * 4
    assert bmt.expert_bytes == expert and bmt.n_expert == MOE.n_expert
    assert bmt.dense_bytes == size - MOE.n_expert * expert
    one_token = bmt.tick_bytes(1, 0) - bmt.act_bytes_per_token
    assert one_token == bmt.dense_bytes + MOE.n_expert_used * expert
    assert bmt.tick_bytes(100, 0) - 100 * bmt.act_bytes_per_token == size


def test_kv_bytes_follow_the_cache_type(tiny_path):
    with _core.Model(tiny_path) as m:
        f16, q4 = BmtModel.of(m, "f16"), BmtModel.of(m, "q4_0")
    tiny = synth.PRESETS["tiny"]
    per_pos = 2 * tiny.n_layer * tiny.n_embd // tiny.n_head * tiny.n_head_kv
    assert f16.kv_bytes_per_pos == per_pos * 2
    assert q4.kv_bytes_per_pos == per_pos * 18 / 32
