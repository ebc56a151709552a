from __future__ import annotations

import argparse

import pytest

from oven.control.config import ControlConfig
from oven.control.resources.exhaustion import ExhaustionPolicy
from oven.control.scheduling.policy import DispatchPolicy
from oven.control.scheduling.interception import InterceptionPolicy
from oven.inference.config import InferenceConfig
from oven.client.openai_api.frontend import OpenAIConfig
from oven.proto.config_loader import add_config_arguments, config_from_args, config_to_argv, setting_help, settings


def parse(argv):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, InferenceConfig)
    return parser.parse_args(argv)


def test_precedence_file_env_flags(tmp_path, monkeypatch):
    config = tmp_path / "oven.toml"
    config.write_text('[inference]\npage_size = 8\nnum_embeds = 100\nmodel = "tiny"\n')
    monkeypatch.setenv("OVEN_NUM_EMBEDS", "200")
    monkeypatch.setenv("OVEN_MODEL", "dummy:llama-3.2-1b")
    cfg = config_from_args(InferenceConfig, parse(["--config", str(config), "--model", "tiny", "--num-kv-pages", "7"]))
    assert (cfg.page_size, cfg.num_embeds, cfg.model, cfg.num_kv_pages) == (8, 200, "tiny", 7)


def test_argv_round_trip(monkeypatch):
    for name in ("OVEN_TORCH_THREADS", "OVEN_MODEL"):
        monkeypatch.delenv(name, raising=False)
    cfg = InferenceConfig(model="tiny", page_size=32, num_kv_pages=5)
    assert config_from_args(InferenceConfig, parse(config_to_argv(cfg))) == cfg


@pytest.mark.parametrize("argv, env, fragment", [
    (["--page-size", "0"], {}, "page_size"),
    ([], {"OVEN_DEVICE": "tpu"}, "device must be one of"),  # a flag's choices are argparse's (below)
    ([], {"OVEN_DTYPE": "int4"}, "dtype must be one of"),
])
def test_invalid_settings_are_explained(argv, env, fragment, monkeypatch):
    monkeypatch.delenv("OVEN_TORCH_THREADS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=fragment):
        config_from_args(InferenceConfig, parse(argv))


@pytest.mark.parametrize("cls", [InferenceConfig, ControlConfig, OpenAIConfig])
def test_every_setting_has_one_line_of_help(cls):
    for field in settings(cls):
        assert setting_help(field).strip() and "\n" not in setting_help(field), field.name


@pytest.mark.parametrize("flag, value, choices", [
    ("--dispatch-policy", "lazy", "'adaptive', 'eager', 'k', 't'"),
    ("--exhaustion-policy", "lifo", "'preempt', 'terminate-newest', 'wait', 'offload'"),
    ("--interception-policy", "lru", "'infercept', 'preserve', 'discard', 'swap'"),
    ("--attention-backend", "xformers", "'auto', 'torch', 'flashinfer'"),
    ("--device", "tpu", "'auto', 'cpu', 'cuda'"),
    ("--dtype", "int4", "'auto', 'float32', 'bfloat16', 'float16'"),
])
def test_enumerated_settings_show_and_check_their_choices(flag, value, choices, capsys):
    parser = argparse.ArgumentParser(prog="oven serve")
    for cls in (InferenceConfig, ControlConfig):
        add_config_arguments(parser, cls)
    assert f"{flag} {{{choices.replace(chr(39), '').replace(' ', '')}}}" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args([flag, value])
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"oven serve: error: argument {flag}: invalid choice: '{value}' (choose from {choices})")


def test_unknown_file_setting_is_rejected(tmp_path):
    config = tmp_path / "oven.toml"
    config.write_text("[inference]\npage_sise = 8\n")
    with pytest.raises(ValueError, match="page_sise"):
        config_from_args(InferenceConfig, parse(["--config", str(config)]))


def test_control_policies_are_parsed_once_into_typed_values(tmp_path):
    """``dispatch``, ``exhaustion``, ``interception`` and ``http_allow_list`` come from the settings and are no settings
    themselves: no flag, file entry or round-trip argument names them."""
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, ControlConfig)
    config = tmp_path / "oven.toml"
    config.write_text('[control]\ndispatch_policy = "k"\ndispatch_k = 8\nexhaustion_policy = "offload"\n'
                      'interception_policy = "swap"\n')
    cfg = config_from_args(ControlConfig, parser.parse_args(["--config", str(config)]), section="control")
    assert (cfg.dispatch, cfg.exhaustion, cfg.interception) == (DispatchPolicy.k(8), ExhaustionPolicy.offload(),
                                                                InterceptionPolicy("swap"))
    assert config_from_args(ControlConfig, parser.parse_args(config_to_argv(cfg)), section="control") == cfg
    derived = {"--dispatch", "--exhaustion", "--interception", "--http-allow-list"}
    assert not derived & set(config_to_argv(cfg)) and not derived & set(parser.format_help().split())
    config.write_text('[control]\ndispatch = "eager"\n')
    with pytest.raises(ValueError, match="unknown settings in \\[control\\]: dispatch$"):
        config_from_args(ControlConfig, parser.parse_args(["--config", str(config)]), section="control")
    with pytest.raises(ValueError, match=r"unknown dispatch policy 'lazy' \(expected one of adaptive, eager, k, t\)"):
        ControlConfig(dispatch_policy="lazy")
    with pytest.raises(ValueError, match="unknown exhaustion policy 'lifo'"):
        ControlConfig(exhaustion_policy="lifo")
    with pytest.raises(ValueError, match="unknown interception policy 'lru'"):
        ControlConfig(interception_policy="lru")
