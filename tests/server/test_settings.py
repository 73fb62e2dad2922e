"""Settings from file, environment and flags."""

import re
from pathlib import Path

import pytest

from uma.errors import InvalidRequestError
from uma.knobs import KNOBS
from uma.sched.bound import BoundPolicy
from uma.sched.knob_defaults import knob_default
from uma.sched.policies import create_policy
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


@pytest.mark.parametrize(("written", "gbps"), [
    ("320GBps", 320.0), ("320 GB/s", 320.0), ("1.5TB/s", 1500.0), ("800 MBps", 0.8),
    ("64", 64.0), (64, 64.0), (0, 0)])
def test_a_bandwidth_is_read_with_its_unit(written, gbps):
    s = settings.resolve([{"model": "m.gguf", "bmt_budget": written}])
    assert s.engine.bmt_budget_gbps == pytest.approx(gbps)


def test_a_bandwidth_in_the_environment_and_a_file_takes_units(tmp_path):
    conf = tmp_path / "uma.toml"
    conf.write_text('bmt_budget = "100 GB/s"\nhttp = "off"\n')
    s = settings.resolve([settings.read_file(conf)], demo_model="m.gguf")
    assert s.engine.bmt_budget_gbps == 100.0 and s.server.http is None
    s = settings.resolve([settings.from_environment({"UMA_BMT_BUDGET": "2.5gbps"})],
                         demo_model="m.gguf")
    assert s.engine.bmt_budget_gbps == 2.5
    with pytest.raises(InvalidRequestError, match=r"invalid UMA_BMT_BUDGET: must be a bandwidth"):
        settings.resolve([settings.from_environment({"UMA_BMT_BUDGET": "lots"})],
                         demo_model="m.gguf")


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
    doc = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "configuration.md").read_text()
    rows = {m[0]: m[1:] for m in re.findall(r"^\| `([a-z_]+)` \| ([^|]*) \| ([^|]*) \|", doc,
                                           re.M)}
    for s in settings.SETTINGS:
        assert s.name in rows, f"{s.name} is not in docs/guide/configuration.md"
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


# --- the scheduling policy's knobs (uma.knobs) -------------------------------------------------


def test_a_knob_from_file_environment_or_flag_reaches_the_policy(tmp_path):
    conf = tmp_path / "uma.toml"
    conf.write_text('min_prefill = 32\nbackground_share = 0.3\nmax_pause_rate = 0.02\n')
    env = settings.from_environment({"UMA_BACKGROUND_SHARE": "0.4", "UMA_GAP_FACTOR": "2"})
    s = settings.resolve([settings.read_file(conf), env, {"gap_ms": 80.0}])
    policy = create_policy(s.engine.policy, s.engine)
    assert isinstance(policy, BoundPolicy)
    assert (policy.min_prefill, policy.background_share, policy.gap_factor) == (32, 0.4, 2.0)
    assert policy.max_pause_rate == 0.02 and policy.gap_ms == 80.0
    assert policy.tail_margin == BoundPolicy().tail_margin  # not given: the policy's default
    assert dict(s.engine.slo).keys() == {"min_prefill", "background_share", "max_pause_rate",
                                         "gap_factor", "gap_ms"}


@pytest.mark.parametrize("source", ["file", "env", "flag"])
def test_the_removed_slo_policy_is_refused_naming_the_setting_and_the_policies(tmp_path,
                                                                               source):
    conf = tmp_path / "uma.toml"
    conf.write_text('policy = "slo"\n')
    given = {"file": settings.read_file(conf),
             "env": settings.from_environment({"UMA_POLICY": "slo"}),
             "flag": {"policy": "slo"}}[source]
    with pytest.raises(InvalidRequestError) as info:
        settings.resolve([given])
    label = {"file": f"policy in {conf}", "env": "UMA_POLICY", "flag": "--policy"}[source]
    assert str(info.value) == f"invalid {label}: must be 'bound' or 'baseline', not 'slo'"


def test_config_shows_each_knobs_effective_value_and_source():
    env = settings.from_environment({"UMA_TTFT_BURST_TOKENS": "64"})
    rows = {name: (value, where) for name, value, where in settings.resolve(
        [env, {"gap_ms": 80.0}]).table()}
    assert rows["ttft_burst_tokens"] == (64, "UMA_TTFT_BURST_TOKENS")
    assert rows["gap_ms"] == (80.0, "--gap-ms")
    assert rows["background_share"] == (BoundPolicy().background_share, "default")
    assert rows["gap_margin"] == (BoundPolicy().gap_margin, "default")
    assert all(k.name in rows for k in KNOBS)


def test_knob_settings_show_the_policys_defaults():
    for k in KNOBS:
        s = settings.BY_NAME[k.name]
        assert (s.kind, s.help, s.config) == (k.kind, k.help, "slo")
        if k.kind is bool:
            assert s.default == ("on" if knob_default(k) else "off")
        else:
            assert float(s.default) == knob_default(k)  # shown without losing a digit
    assert len(settings.BY_NAME) == len(settings.SETTINGS)  # no knob shadows a setting


@pytest.mark.parametrize(("text", "message"), [
    ("gap_factor = 0.5", "invalid gap_factor in {}: must be >= 1, not 0.5"),
    ("min_prefill = 2.5", "invalid min_prefill in {}: must be an integer, not 2.5"),
    ("ttft_burst_tokens = true", "invalid ttft_burst_tokens in {}: must be an integer, not True"),
    ("background_share = 0.95", "invalid background_share in {}: must be in [0, 0.9], not 0.95"),
    ("idle_budget_ms = inf", "invalid idle_budget_ms in {}: must be finite, not inf"),
    ("gap_facter = 2.0", "{}: unknown setting(s) gap_facter (nearest: gap_factor)"),
    ("hold_ticks = 4", "{}: unknown setting(s) hold_ticks (nearest: "),
])
def test_bad_knobs_in_a_file_name_the_key(tmp_path, text, message):
    conf = tmp_path / "uma.toml"
    conf.write_text(text + "\n")
    with pytest.raises(InvalidRequestError) as info:
        settings.resolve([settings.read_file(conf)])
    assert str(info.value).startswith(message.format(conf)), str(info.value)


@pytest.mark.parametrize(("source", "message"), [
    ({"UMA_QUANTILE": "1"}, "invalid UMA_QUANTILE: must be in (0, 1), not 1.0"),
    ({"UMA_TTFT_BURST_TOKENS": "-1"},
     "invalid UMA_TTFT_BURST_TOKENS: must be in [0, 1048576], not -1"),
    ({"UMA_MIN_PREFILL": "8.5"}, "invalid UMA_MIN_PREFILL: must be an integer, not '8.5'"),
    ({"UMA_IDLE_AMORTISE": "lots"}, "invalid UMA_IDLE_AMORTISE: must be a number, not 'lots'"),
])
def test_bad_knobs_in_the_environment_name_the_variable(source, message):
    with pytest.raises(InvalidRequestError) as info:
        settings.resolve([settings.from_environment(source)])
    assert str(info.value).startswith(message), str(info.value)


def test_a_bad_knob_flag_names_the_flag():
    with pytest.raises(InvalidRequestError) as info:
        settings.resolve([{"ttft_stretch": 0.9}])
    assert str(info.value) == "invalid --ttft-stretch: must be >= 1, not 0.9"


def test_the_older_guards_knobs_are_unknown_settings():
    # the environment ignores variables that name no setting, as it does any other
    env = settings.from_environment({"UMA_BACKGROUND_SHARE": "0.25", "UMA_PAUSE_FACTOR": "2"})
    assert dict(env.values) == {"background_share": 0.25}
    s = settings.resolve([env, {"ttft_burst_tokens": 0, "latency_cap": 1.5}])
    policy = create_policy(s.engine.policy, s.engine)
    assert isinstance(policy, BoundPolicy)
    assert (policy.background_share, policy.ttft_burst_tokens, policy.latency_cap) \
        == (0.25, 0, 1.5)
    assert "pause_factor" not in settings.NAMES and "hold_ticks" not in settings.NAMES



def test_an_slo_table_in_the_file_holds_knobs_for_experts(tmp_path):
    conf = tmp_path / "uma.toml"
    conf.write_text('model = "m.gguf"\nbackground_share = 0.2\n[slo]\ngap_factor = 3\n'
                    'max_pause_rate = 0.02\n')
    s = settings.resolve([settings.read_file(conf)])
    policy = create_policy(s.engine.policy, s.engine)
    assert (policy.background_share, policy.gap_factor, policy.max_pause_rate) \
        == (0.2, 3.0, 0.02)
    # [slo] is the knobs' section of the nested shape (uma.server.config_shape)
    conf.write_text('[slo]\nctx = 4096\n')
    with pytest.raises(InvalidRequestError, match=r"unknown setting\(s\) slo.ctx \(nearest: "
                                                  r"kv.ctx\)"):
        settings.read_file(conf)
    conf.write_text('gap_ms = 80\n[slo]\ngap_ms = 90\n')
    with pytest.raises(InvalidRequestError, match="gap_ms and slo.gap_ms both set gap_ms"):
        settings.read_file(conf)
    conf.write_text('slo = 3\n')
    with pytest.raises(InvalidRequestError, match="invalid slo in .*: must be a table"):
        settings.read_file(conf)


# --- the scorecard's log (docs/design/metrics.md, "Scorecard") ----------------------------------


def test_the_scorecard_log_settings_reach_the_server(tmp_path):
    conf = tmp_path / "uma.toml"
    conf.write_text(f'scorecard_interval_s = 5\nscorecard_csv = "{tmp_path / "s.csv"}"\n')
    s = settings.resolve([settings.read_file(conf)])
    assert (s.server.scorecard_interval_s, s.server.scorecard_csv) == (5.0, str(tmp_path / "s.csv"))
    assert settings.resolve([{}]).server.scorecard_interval_s == 0.0  # off


@pytest.mark.parametrize(("source", "message"), [
    ({"UMA_SCORECARD_INTERVAL_S": "-1"},
     "invalid UMA_SCORECARD_INTERVAL_S: must be >= 0 (0: off), not -1.0"),
    ({"UMA_SCORECARD_INTERVAL_S": "often"},
     "invalid UMA_SCORECARD_INTERVAL_S: must be a number, not 'often'"),
    ({"UMA_SCORECARD_INTERVAL_S": "nan"},
     "invalid UMA_SCORECARD_INTERVAL_S: must be finite, not nan"),
    ({"UMA_SCORECARD_CSV": "/tmp/s.csv"},
     "invalid UMA_SCORECARD_CSV: needs scorecard_interval_s > 0"),
])
def test_a_bad_scorecard_setting_is_refused_naming_it(source, message):
    with pytest.raises(InvalidRequestError) as info:
        settings.resolve([settings.from_environment(source)])
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(("text", "message"), [
    ("scorecard_interval_s = -0.5", "must be >= 0"),
    ('scorecard_interval_s = "5s"', "must be a number, not '5s'"),
])
def test_a_bad_scorecard_interval_in_a_file_is_refused_naming_it(tmp_path, text, message):
    conf = tmp_path / "uma.toml"
    conf.write_text(text + "\n")
    with pytest.raises(InvalidRequestError,
                       match=rf"^invalid scorecard_interval_s in .*uma.toml: {message}"):
        settings.resolve([settings.read_file(conf)])


def test_an_moes_experts_per_token_from_a_flag_the_environment_or_a_nested_file(tmp_path):
    conf = tmp_path / "uma.yaml"
    conf.write_text("model:\n  path: m.gguf\n  experts_used: 1\n")
    assert settings.resolve([settings.read_file(conf)]).engine.n_expert_used == 1
    env = settings.from_environment({"UMA_EXPERTS_USED": "2"})
    assert settings.resolve([settings.read_file(conf), env]).engine.n_expert_used == 2
    assert settings.resolve([{"model": "m.gguf"}]).engine.n_expert_used == 0  # the model's
    with pytest.raises(InvalidRequestError, match=r"invalid UMA_EXPERTS_USED: .*\[0, 1024\]"):
        settings.resolve([settings.from_environment({"UMA_EXPERTS_USED": "-1"})],
                         demo_model="m.gguf")


def test_the_daemon_keeps_its_prefix_cache_on_disk_unless_told_not_to(tmp_path):
    assert settings.resolve([{"model": "m.gguf"}]).engine.prefix_cache_disk_mb == 4096
    env = settings.from_environment({"UMA_PREFIX_CACHE_DISK_MB": "0",
                                     "UMA_PREFIX_CACHE_DIR": str(tmp_path)})
    s = settings.resolve([{"model": "m.gguf"}, env])
    assert s.engine.prefix_cache_disk_mb == 0 and s.engine.prefix_cache_dir == str(tmp_path)
    with pytest.raises(InvalidRequestError, match=r"invalid UMA_PREFIX_CACHE_DISK_MB"):
        settings.resolve([settings.from_environment({"UMA_PREFIX_CACHE_DISK_MB": "-1"})],
                         demo_model="m.gguf")
