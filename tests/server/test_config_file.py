"""The config file's syntaxes (uma.server.config_file): TOML or YAML by the file's extension,
and settings written back in either."""

import pytest

from uma.errors import InvalidRequestError
from uma.server import config_file, settings
from uma.server.config_file import Unwritten


@pytest.mark.parametrize("name", ["uma.toml", "uma.yaml", "uma.yml", "UMA.YAML"])
def test_the_extension_chooses_the_syntax(tmp_path, name):
    conf = tmp_path / name
    conf.write_text('ctx = 2048\n' if name.endswith("toml") else "ctx: 2048\n")
    assert config_file.load(conf) == {"ctx": 2048}


@pytest.mark.parametrize("name", ["uma.conf", "uma"])
def test_any_other_name_is_read_as_toml_as_before(tmp_path, name):
    conf = tmp_path / name
    conf.write_text('ctx = 2048\n')
    assert config_file.load(conf) == {"ctx": 2048}


@pytest.mark.parametrize("name", ["uma.json", "uma.ini", "uma.cfg"])
def test_other_formats_are_refused_naming_the_accepted_ones(tmp_path, name):
    conf = tmp_path / name
    conf.write_text('{"ctx": 2048}\n')
    with pytest.raises(InvalidRequestError) as info:
        config_file.load(conf)
    assert str(info.value).startswith(f"config file {conf}: ")
    assert "give a .toml, .yaml or .yml file" in str(info.value)


def test_a_flat_toml_file_still_loads_unchanged(tmp_path):
    conf = tmp_path / "uma.toml"
    conf.write_text('model = "m.gguf"\nctx = 2048\nkv_type = "q8_0"\nhttp = "off"\n'
                    'gap_ms = 80\n[slo]\ngap_factor = 3\n')
    assert dict(settings.read_file(conf).values) == {
        "model": "m.gguf", "ctx": 2048, "kv_type": "q8_0", "http": "off", "gap_ms": 80,
        "gap_factor": 3}


def test_a_flat_yaml_file_gives_what_the_same_toml_file_gives(tmp_path):
    (tmp_path / "uma.toml").write_text('ctx = 2048\nflash_attn = "off"\nkv_unified = false\n'
                                       'bmt_budget = "320GBps"\n')
    (tmp_path / "uma.yaml").write_text("ctx: 2048\nflash_attn: off\nkv_unified: false\n"
                                       "bmt_budget: 320GBps\n")
    toml, yaml = (settings.read_file(tmp_path / n) for n in ("uma.toml", "uma.yaml"))
    assert dict(toml.values) == dict(yaml.values)


def test_yaml_reads_on_and_off_as_text_as_toml_and_the_environment_do(tmp_path):
    # YAML 1.1 reads on/off/yes/no as booleans: `http: off` would be false, not "off"
    conf = tmp_path / "uma.yaml"
    conf.write_text("http: off\nflash_attn: on\ndevice_sampling: auto\nfair_share: true\n")
    assert config_file.load(conf) == {"http": "off", "flash_attn": "on",
                                      "device_sampling": "auto", "fair_share": True}
    conf.write_text("kv_unified: yes\n")
    with pytest.raises(InvalidRequestError, match="invalid kv_unified in .*: must be true or "
                                                  "false, not 'yes'"):
        settings.read_file(conf)


def test_yaml_that_does_not_parse_names_the_file_and_the_line(tmp_path):
    conf = tmp_path / "uma.yaml"
    conf.write_text("kv:\n  ctx: 4096\n   type: q8_0\n")
    with pytest.raises(InvalidRequestError) as info:
        config_file.load(conf)
    assert str(info.value).startswith(f"{conf}, line 3: not valid YAML: ")


def test_a_yaml_key_given_twice_is_refused_at_its_line(tmp_path):
    conf = tmp_path / "uma.yaml"
    conf.write_text("kv:\n  ctx: 4096\n  ctx: 8192\n")
    with pytest.raises(InvalidRequestError) as info:
        config_file.load(conf)
    assert str(info.value).startswith(f"{conf}, line 3: not valid YAML: duplicate key 'ctx'")


def test_toml_that_does_not_parse_names_the_file_and_the_line(tmp_path):
    conf = tmp_path / "uma.toml"
    conf.write_text("ctx = 4096\nctx = \n")
    with pytest.raises(InvalidRequestError, match=r"uma.toml is not valid TOML: .*line 2"):
        config_file.load(conf)


@pytest.mark.parametrize(("text", "loaded"), [("", {}), ("# nothing yet\n", {})])
def test_an_empty_yaml_file_holds_no_settings(tmp_path, text, loaded):
    conf = tmp_path / "uma.yaml"
    conf.write_text(text)
    assert config_file.load(conf) == loaded


def test_a_yaml_file_that_is_not_a_mapping_is_refused(tmp_path):
    conf = tmp_path / "uma.yaml"
    conf.write_text("- ctx\n- 4096\n")
    with pytest.raises(InvalidRequestError, match="must be a mapping of settings, not list"):
        config_file.load(conf)


def test_missing_files_and_directories_are_named(tmp_path):
    with pytest.raises(InvalidRequestError, match="config file not found"):
        config_file.load(tmp_path / "none.yaml")
    (tmp_path / "d.toml").mkdir()
    with pytest.raises(InvalidRequestError, match="is a directory"):
        config_file.load(tmp_path / "d.toml")


TREE = {"latency_cap": 1.2, "model": {"path": Unwritten("none"), "flash_attn": "off"},
        "qos": {"interactive": {"priority": 10}}, "kv": {"unified": True, "ctx": 4096}}


@pytest.mark.parametrize("fmt", ["toml", "yaml"])
def test_dump_writes_a_file_that_loads_back(tmp_path, fmt):
    text = config_file.dump(TREE, fmt, {"kv.ctx": "UMA_CTX"})
    assert "UMA_CTX" in text and "path" in text
    conf = tmp_path / f"uma.{fmt}"
    conf.write_text(text)
    assert config_file.load(conf) == {
        "latency_cap": 1.2, "model": {"flash_attn": "off"},
        "qos": {"interactive": {"priority": 10}}, "kv": {"unified": True, "ctx": 4096}}


def test_as_written_gives_lists_as_the_settings_read_them():
    assert config_file.as_written((("editor", 2.0), ("batch", 0.5))) == "editor=2,batch=0.5"
    assert config_file.as_written((1.0, 1.0, 2.0)) == "1,1,2"
    assert config_file.as_written(("a:1", "b:2")) == "a:1,b:2"
    assert config_file.as_written(()) == Unwritten("none") == config_file.as_written(None)
    assert config_file.as_written(8) == 8
