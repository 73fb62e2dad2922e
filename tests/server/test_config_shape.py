"""The config file's nested shape (uma.server.config_shape): the table from dotted paths to
settings, and files in the design brief's shape read through it."""

import re
from pathlib import Path

import pytest

from uma.errors import InvalidRequestError
from uma.server import config_shape, settings
from uma.server.config_shape import NESTED

# The brief's example ("Runtime config (YAML)", seed 004) as YAML, as TOML, and flat
BRIEF_YAML = """\
latency_cap: 1.20
bmt_budget_gbps: 320
qos:
  interactive: {priority: 10}
  background:  {priority: 1}
scheduler:
  max_merge: 4
  preempt_at_token: true
logging:
  scorecard_interval_s: 5
"""
BRIEF_TOML = """\
latency_cap = 1.20
bmt_budget_gbps = 320
[qos]
interactive = {priority = 10}
background = {priority = 1}
[scheduler]
max_merge = 4
preempt_at_token = true
[logging]
scorecard_interval_s = 5
"""
BRIEF_FLAT = ("latency_cap = 1.2\nbmt_budget = 320\nparallel = 4\npreempt_at_token = true\n"
              "scorecard_interval_s = 5\n")


def effective(path: Path) -> dict[str, object]:
    return {name: value for name, value, _ in
            settings.resolve([settings.read_file(path)], demo_model="m.gguf").table()}


def test_every_setting_has_exactly_one_nested_path():
    targets = list(NESTED.values())
    for name in settings.NAMES:
        assert targets.count(name) == 1, name
    assert set(targets) == settings.NAMES
    assert len(set(targets)) == len(targets)


def test_docs_list_the_mapping_table_as_it_is():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "configuration.md").read_text()
    table = doc.split("| nested path | setting |", 1)[1]
    rows = re.findall(r"^\| `([a-z_.]+)` \| `([a-z_]+)` \|$", table, re.M)
    assert rows == list(NESTED.items())


@pytest.mark.parametrize(("name", "text"), [("uma.yaml", BRIEF_YAML), ("uma.toml", BRIEF_TOML)])
def test_the_brief_example_gives_the_settings_of_its_flat_file(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    (tmp_path / "flat.toml").write_text(BRIEF_FLAT)
    nested = effective(tmp_path / name)
    assert nested == effective(tmp_path / "flat.toml")
    assert (nested["latency_cap"], nested["bmt_budget"], nested["parallel"],
            nested["scorecard_interval_s"]) == (1.2, 320, 4, 5)


def test_every_setting_can_be_given_nested_and_each_path_names_it_in_messages(tmp_path):
    conf = tmp_path / "uma.toml"
    conf.write_text('latency_cap = 1.1\n[model]\npath = "m.gguf"\nthreads = 2\n'
                    '[kv]\nctx = 2048\ntype = "q8_0"\n[slo]\ngap_factor = 3\n'
                    '[apps]\nweights = "editor=2"\n[socket]\npath = "/tmp/s.sock"\n'
                    '[http]\naddress = "127.0.0.1:0"\n[logging]\nlevel = "info"\n')
    source = settings.read_file(conf)
    s = settings.resolve([source])
    assert (s.engine.model, s.engine.n_threads, s.engine.n_ctx) == ("m.gguf", 2, 2048)
    assert (s.engine.type_k, s.engine.type_v, s.engine.app_weights) == (
        "q8_0", "q8_0", (("editor", 2.0),))
    assert (s.server.socket, s.server.http, s.log_level) == ("/tmp/s.sock", "127.0.0.1:0", "info")
    assert dict(s.engine.slo) == {"gap_factor": 3}
    rows = {name: where for name, _, where in s.table()}
    assert rows["type_k"] == f"kv.type in {conf}" and rows["ctx"] == f"kv.ctx in {conf}"
    assert rows["latency_cap"] == f"latency_cap in {conf}"


def test_a_section_named_as_a_setting_is_the_setting_unless_it_holds_a_table(tmp_path):
    conf = tmp_path / "uma.toml"
    conf.write_text('model = "a.gguf"\nsocket = "/tmp/a.sock"\n')
    flat = settings.resolve([settings.read_file(conf)])
    conf.write_text('[model]\npath = "a.gguf"\n[socket]\npath = "/tmp/a.sock"\n')
    nested = settings.resolve([settings.read_file(conf)])
    assert (flat.engine, flat.server) == (nested.engine, nested.server)


@pytest.mark.parametrize(("text", "message"), [
    ("ctx = 1024\n[kv]\nctx = 2048", "{}: ctx and kv.ctx both set ctx; give one of them"),
    ("parallel = 2\n[scheduler]\nmax_merge = 4",
     "{}: parallel and scheduler.max_merge both set parallel"),
    ("bmt_budget = 100\nbmt_budget_gbps = 320",
     "{}: bmt_budget and bmt_budget_gbps both set bmt_budget"),
])
def test_a_setting_given_flat_and_nested_is_refused_naming_both(tmp_path, text, message):
    conf = tmp_path / "uma.toml"
    conf.write_text(text + "\n")
    with pytest.raises(InvalidRequestError) as info:
        settings.read_file(conf)
    assert str(info.value).startswith(message.format(conf)), str(info.value)


@pytest.mark.parametrize(("text", "message"), [
    ("[scheduler]\nmax_merg = 4", "unknown setting(s) scheduler.max_merg "
                                  "(nearest: scheduler.max_merge)"),
    ("[scheduler]\nparallel = 4", "scheduler.parallel (nearest: scheduler.max_merge)"),
    ("[scheduler]\nctx = 4", "scheduler.ctx (nearest: kv.ctx)"),
    ("[qos.batch]\npriority = 1", "qos.batch.priority (nearest: qos.background.priority)"),
    ("[kv]\nctxx = 1\nunifed = true", "kv.ctxx (nearest: kv.ctx), kv.unifed (nearest: "
                                      "kv.unified)"),
    ("[network]\nport = 8080", "network.port (nearest: "),
])
def test_an_unknown_nested_key_names_its_path_and_the_nearest_known_one(tmp_path, text,
                                                                      message):
    conf = tmp_path / "uma.toml"
    conf.write_text(text + "\n")
    with pytest.raises(InvalidRequestError) as info:
        settings.read_file(conf)
    assert f"{conf}: unknown setting(s) " in str(info.value)
    assert message in str(info.value)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("uma.yaml", "scheduler:\n  max_merge: four\n",
     "invalid scheduler.max_merge in {}: must be an integer, not 'four'"),
    ("uma.toml", "[kv]\nunified = \"yes\"\n",
     "invalid kv.unified in {}: must be true or false, not 'yes'"),
    ("uma.yaml", "latency_cap: fast\n", "invalid latency_cap in {}: must be a number, not 'fast'"),
    ("uma.yaml", "kv:\n  ctx: {size: 4}\n",
     "invalid kv.ctx in {}: must be an integer, not {{'size': 4}}"),
    ("uma.yaml", "kv: 4096\n", "invalid kv in {}: must be a table (of ctx, prefix_cache, "),
    ("uma.yaml", "bmt_budget_gbps: lots\n", "invalid bmt_budget_gbps in {}: must be a bandwidth"),
    ("uma.yaml", "scheduler:\n  max_merge: 0\n", "invalid scheduler.max_merge in {}: must be in"),
])
def test_a_wrong_value_names_the_dotted_path_and_what_is_expected(tmp_path, name, text,
                                                                   message):
    conf = tmp_path / name
    conf.write_text(text)
    with pytest.raises(InvalidRequestError) as info:
        settings.resolve([settings.read_file(conf)], demo_model="m.gguf")
    assert str(info.value).startswith(message.format(conf)), str(info.value)


@pytest.mark.parametrize(("qos", "message"), [
    ({"interactive": 1, "background": 10}, "qos.interactive.priority (1) must be above "
                                           "qos.background.priority (10): the daemon has"),
    ({"interactive": 5, "background": 5}, "qos.interactive.priority (5) must be above"),
    ({"interactive": 10}, "qos.interactive.priority alone says nothing: give both"),
    ({"interactive": "high", "background": 1},
     "invalid qos.interactive.priority in {}: must be a number, not 'high'"),
    ({"interactive": True, "background": 1},
     "invalid qos.interactive.priority in {}: must be a number, not True"),
])
def test_qos_priorities_are_read_for_their_order_only(tmp_path, qos, message):
    conf = tmp_path / "uma.yaml"
    conf.write_text("qos:\n" + "".join(f"  {k}: {{priority: {v!r}}}\n".replace("'", "")
                                       for k, v in qos.items()))
    with pytest.raises(InvalidRequestError) as info:
        settings.read_file(conf)
    assert message.format(conf) in str(info.value)


def test_qos_priorities_in_the_daemons_order_set_nothing(tmp_path):
    conf = tmp_path / "uma.yaml"
    conf.write_text("qos:\n  interactive: {priority: 2.5}\n  background: {priority: -1}\n")
    assert dict(settings.read_file(conf).values) == {}


def test_preempt_at_token_sets_the_demotion_setting(tmp_path):
    conf = tmp_path / "uma.yaml"
    conf.write_text("scheduler:\n  preempt_at_token: false\n")
    assert dict(settings.read_file(conf).values) == {"preempt_at_token": False}
    conf.write_text("scheduler:\n  preempt_at_token: 1\n")
    with pytest.raises(InvalidRequestError, match=r"scheduler.preempt_at_token"):
        settings.read_file(conf)


def test_nest_puts_each_setting_at_its_path_in_the_tables_order():
    tree = config_shape.nest({"ctx": 1, "latency_cap": 1.2, "parallel": 4, "gap_ms": 80.0})
    assert tree == {"latency_cap": 1.2, "kv": {"ctx": 1}, "scheduler": {"max_merge": 4},
                    "slo": {"gap_ms": 80.0}}
    assert list(tree) == ["latency_cap", "kv", "scheduler", "slo"]
