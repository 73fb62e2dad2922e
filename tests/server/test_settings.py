"""Settings from file, environment and flags."""

import re
from pathlib import Path

import pytest

from uma.errors import InvalidRequestError
from uma.server import settings


def test_precedence_file_then_environment_then_flags(tmp_path):
    conf = tmp_path / "uma.toml"
    conf.write_text('model = "a.gguf"\nctx = 1024\nparallel = 2\nsocket = "/tmp/x.sock"\n')
    env = settings.from_environment({"UMA_CTX": "2048", "UMA_KV_UNIFIED": "false"})
    s = settings.resolve([settings.read_file(conf), env, {"parallel": 4, "ctx": None}])
    assert (s.engine.model, s.engine.n_ctx, s.engine.n_seq_max) == ("a.gguf", 2048, 4)
    assert s.engine.kv_unified is False and s.server.socket == "/tmp/x.sock"


def test_kv_type_sets_both_caches():
    s = settings.resolve([{"model": "m.gguf", "kv_type": "q8_0", "socket": "/tmp/s"}])
    assert (s.engine.type_k, s.engine.type_v) == ("q8_0", "q8_0")


def test_demo_model_and_default_socket(monkeypatch):
    monkeypatch.setenv("UMA_SOCKET", "/tmp/from-env.sock")
    s = settings.resolve([{}], demo_model="demo.gguf")
    assert s.engine.model == "demo.gguf" and s.server.socket == "/tmp/from-env.sock"


@pytest.mark.parametrize(
    ("text", "match"),
    [("ctx = [1]", "invalid ctx in .*bad.toml: must be an integer"),
     ("nonsense = 1", "nonsense"), ("ctx = ", "TOML"),
     ("max_tokens = 0", "invalid max_tokens in .*bad.toml: must be in"),
     ("grace = -1", "invalid grace in .*bad.toml: must be > 0")],
)
def test_bad_files_name_the_problem(tmp_path, text, match):
    conf = tmp_path / "bad.toml"
    conf.write_text(f'model = "m.gguf"\nsocket = "/tmp/s"\n{text}\n')
    with pytest.raises(InvalidRequestError, match=match):
        settings.resolve([settings.read_file(conf)])


def test_missing_file_and_missing_model(tmp_path):
    with pytest.raises(InvalidRequestError, match="not found"):
        settings.read_file(tmp_path / "none.toml")
    with pytest.raises(InvalidRequestError, match="no model"):
        settings.resolve([{"socket": "/tmp/s"}], demo_model=None)


def test_config_md_lists_every_setting_with_its_flag_and_default():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "CONFIG.md").read_text()
    rows = {m[0]: m[1:] for m in re.findall(r"^\| `([a-z_]+)` \| ([^|]*) \| ([^|]*) \|", doc,
                                           re.M)}
    for s in settings.SETTINGS:
        assert s.name in rows, f"{s.name} is not in docs/CONFIG.md"
        flag, default = rows[s.name]
        assert default == s.default, s.name
        assert (s.option in flag) == s.flag or s.name == "model", s.name
    assert set(rows) == set(settings.NAMES)


@pytest.mark.parametrize(("source", "label"), [
    ({"UMA_CTX": "-5"}, "invalid UMA_CTX: must be in [1, 2**31), not -5"),
    ({"UMA_KV_TYPE": "q7"}, "invalid UMA_KV_TYPE: must be one of"),
    ({"UMA_LOG_LEVEL": "loud"}, "invalid UMA_LOG_LEVEL: must be none, error"),
    ({"UMA_MAX_INPUT_BYTES": "1000"}, "invalid UMA_MAX_INPUT_BYTES: (1000) must be at least"),
])
def test_errors_name_the_setting_as_it_was_given(source, label):
    with pytest.raises(InvalidRequestError) as info:
        settings.resolve([settings.from_environment(source)])
    assert str(info.value).startswith(label), str(info.value)
