"""Settings fail closed: an empty or unreadable path, a non-finite or out-of-range
number, from the file, a variable or a flag, is one error line naming the key and its source, never a silent
default.

Start-up is tested on real processes (``querycoord coord``, ``querycoord querynode``, ``querycoord config show``):
exit status 2 and the one line. The rule over every numeric key and every source is a hypothesis property on the
same parsing the command line does (``build_parser`` then ``apply_layers``), with the environment passed
explicitly.
"""

from __future__ import annotations

import asyncio
import math
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meta.ops.child import child_env
from querycoord.cli import build_parser
from querycoord.cli.config_cmd import settings as config_rows
from querycoord.settings.config import CoordConfig
from querycoord.settings.config_file import SETTINGS, Setting, apply_layers
from querycoord.settings.coord_options import OPTIONS, PRESET_RULES, check_numbers, config_from_args, option_value
from querycoord.settings.security_options import OPTIONS as SECURITY_OPTIONS
from querycoord.settings.security_options import security_from_args
from querycoord.settings.setting_rules import Rule
from tests.test_config_file import clean_env  # noqa: F401  (autouse: no QUERYCOORD_* variable of the machine leaks in)

ETCD = "127.0.0.1:1"  # never dialled: every case here stops before it reaches etcd


def build(argv: list[str], env: dict[str, str] | None = None) -> None:
    """What ``coord`` builds before it starts: its configuration and its gRPC security (files read)."""
    args = apply_layers(build_parser().parse_args(argv), env or {})
    config_from_args(args)
    security_from_args(args).check()


# ----- point 3: an empty or unreadable path is an error, never "off" -------------------------------------------------
def test_an_empty_principals_file_setting_is_an_error_from_every_source(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "q.toml"
    config.write_text('[auth]\ntokens_file = ""\n')
    cases = [
        (["coord", "--etcd-endpoints", ETCD, "--config", str(config)], {},
         f"configuration file {config}: [auth] tokens_file is empty"),
        (["coord", "--etcd-endpoints", ETCD], {"QUERYCOORD_AUTH_TOKENS_FILE": ""},
         "$QUERYCOORD_AUTH_TOKENS_FILE is empty"),
        (["coord", "--etcd-endpoints", ETCD, "--auth-tokens-file", ""], {}, "--auth-tokens-file is empty"),
    ]
    for argv, env, says in cases:
        with pytest.raises(ValueError) as e:
            build(argv, env)
        assert str(e.value).startswith(says), (argv, env, str(e.value))
        assert "\n" not in str(e.value)
    # The token a process presents is read from the process's own environment (it is no setting of the file).
    monkeypatch.setenv("QUERYCOORD_AUTH_TOKEN", "")
    with pytest.raises(ValueError, match=r"^\$QUERYCOORD_AUTH_TOKEN is empty"):
        build(["coord", "--etcd-endpoints", ETCD])


@pytest.mark.parametrize(("section", "key"), [
    ("tls", "ca"), ("tls", "cert"), ("tls", "key"), ("tls", "server_name"), ("auth", "token_file"),
    ("auth", "tokens_file"), ("etcd", "cacert"), ("etcd", "cert"), ("etcd", "key"), ("etcd", "user"),
    ("etcd", "password_file"), ("etcd", "server_name"), ("etcd", "endpoints"),
])
def test_every_security_path_or_name_given_empty_is_an_error(tmp_path: Path, section: str, key: str) -> None:
    config = tmp_path / "q.toml"
    endpoints = "" if (section, key) == ("etcd", "endpoints") else f'endpoints = "{ETCD}"\n'
    extra = f'{key} = ""\n' if section == "etcd" else ""
    body = f"[etcd]\n{endpoints}{extra}" + ("" if section == "etcd" else f'[{section}]\n{key} = ""\n')
    config.write_text(body)
    with pytest.raises(ValueError, match=rf"configuration file .*: \[{section}\] {key} is empty"):
        build(["coord", "--config", str(config)])
    env_name = f"QUERYCOORD_{section.upper()}_{key.upper()}"
    with pytest.raises(ValueError, match=rf"\${env_name} is empty"):
        build(["coord", "--etcd-endpoints", ETCD] if key != "endpoints" else ["coord"], {env_name: ""})


@pytest.mark.parametrize("flag", ["--tls-ca", "--tls-cert", "--tls-key", "--auth-token-file", "--auth-tokens-file",
                                  "--etcd-cacert", "--etcd-cert", "--etcd-key", "--etcd-password-file"])
def test_an_unreadable_security_file_names_its_key_and_source(tmp_path: Path, flag: str) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(ValueError) as e:
        build(["coord", "--etcd-endpoints", ETCD, flag, str(missing)])
    assert str(e.value).startswith(f"{flag} cannot be read ({missing}: No such file or directory)"), str(e.value)
    section, _, key = flag.removeprefix("--").partition("-")
    config = tmp_path / "q.toml"
    setting = f'{key.replace("-", "_")} = "{tmp_path}"\n'  # a directory: it exists, but is no file to read
    config.write_text(f'[etcd]\nendpoints = "{ETCD}"\n' + (setting if section == "etcd" else f"[{section}]\n{setting}"))
    with pytest.raises(ValueError, match=rf"configuration file {config}: \[{section}\] {key.replace('-', '_')} "
                                         r"cannot be read \(.*Is a directory\)"):
        build(["coord", "--config", str(config)])


def test_an_empty_bool_variable_or_config_variable_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"\$QUERYCOORD_TLS_CLIENT_AUTH: expected true or false, got ''"):
        build(["coord", "--etcd-endpoints", ETCD], {"QUERYCOORD_TLS_CLIENT_AUTH": ""})
    with pytest.raises(ValueError, match=r"\$QUERYCOORD_CONFIG is empty"):
        build(["coord", "--etcd-endpoints", ETCD], {"QUERYCOORD_CONFIG": ""})


def test_an_empty_http_listen_still_means_no_http_server() -> None:
    """The one string setting whose empty value is documented (no HTTP endpoint) keeps that meaning."""
    args = apply_layers(build_parser().parse_args(["coord", "--etcd-endpoints", ETCD]),
                        {"QUERYCOORD_COORD_HTTP_LISTEN": ""})
    assert config_from_args(args).http_listen == ""


# ----- point 10: every number is finite and within its bounds, whatever its source ----------------------------------
def _rules() -> dict[str, tuple[Setting, Rule]]:
    """Every numeric setting of ``coord`` (its own, the presets', the gRPC ones) with its rule."""
    by_flag: dict[str, Rule] = {o.flag: o.rule for o in OPTIONS}
    by_flag.update(PRESET_RULES)
    by_flag.update({o.flag: o.rule for o in SECURITY_OPTIONS})
    return {s.flag: (s, by_flag[s.flag]) for s in SETTINGS if s.kind in (int, float) and s.flag in by_flag}


NUMERIC = _rules()


def test_every_numeric_setting_has_finite_bounds() -> None:
    assert {"--ttl", "--rpc-timeout", "--checker-interval", "--max-fields", "--grpc-max-message-mb",
            "--stream-scale", "--history-keep"} <= set(NUMERIC)
    for flag, (_, rule) in NUMERIC.items():
        assert rule.low is not None and rule.high is not None, flag


def _bad_values(setting: Setting, rule: Rule) -> list[float]:
    assert rule.low is not None and rule.high is not None
    below = rule.low if rule.above else rule.low - 1
    above = rule.high + 1
    if setting.kind is int:
        return [int(below), int(above)]
    return [math.nan, math.inf, -math.inf, below, above, 1e300]


def _text(value: float) -> str:
    return str(value) if not isinstance(value, float) or math.isfinite(value) else repr(value)


def _source(setting: Setting, value: float, how: str, config: Path) -> tuple[list[str], dict[str, str], str]:
    """argv, environment and the origin an error must name, for ``value`` given ``how``."""
    argv = ["coord", "--etcd-endpoints", ETCD]
    if how == "flag":
        return [*argv, f"{setting.flag}={_text(value)}"], {}, f"{setting.flag} must be"
    if how == "env":
        return argv, {setting.env: _text(value)}, f"${setting.env} must be"
    toml = {math.inf: "inf", -math.inf: "-inf"}.get(value, "nan" if value != value else _text(value))
    config.write_text(f"[{setting.section}]\n{setting.key} = {toml}\n")
    says = f"configuration file {config}: [{setting.section}] {setting.key} must be"
    return [*argv, "--config", str(config)], {}, says


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), flag=st.sampled_from(sorted(NUMERIC)), how=st.sampled_from(["file", "env", "flag"]))
def test_a_non_finite_or_out_of_range_number_is_one_line_naming_key_and_source(
        data: st.DataObject, flag: str, how: str) -> None:
    setting, rule = NUMERIC[flag]
    value = data.draw(st.sampled_from(_bad_values(setting, rule)), label="value")
    with tempfile.TemporaryDirectory() as d:
        argv, env, says = _source(setting, value, how, Path(d) / "q.toml")
        with pytest.raises(ValueError) as e:
            build(argv, env)
    message = str(e.value)
    assert message.startswith(says), (flag, how, value, message)
    assert "\n" not in message


@settings(max_examples=100, deadline=None)
@given(data=st.data(), flag=st.sampled_from(sorted(NUMERIC)), how=st.sampled_from(["file", "env", "flag"]))
def test_a_number_within_its_bounds_is_taken_from_any_source(data: st.DataObject, flag: str, how: str) -> None:
    setting, rule = NUMERIC[flag]
    assert rule.low is not None and rule.high is not None
    if setting.kind is int:
        value: float = data.draw(st.integers(int(rule.low) + int(rule.above), int(rule.high)), label="value")
    else:
        value = data.draw(st.floats(rule.low, rule.high, exclude_min=rule.above, allow_nan=False,
                                    allow_infinity=False), label="value")
    with tempfile.TemporaryDirectory() as d:
        argv, env, _ = _source(setting, value, how, Path(d) / "q.toml")
        args = apply_layers(build_parser().parse_args(argv), env)
        config = config_from_args(args)
        security = security_from_args(args)
    option = next((o for o in OPTIONS if o.flag == flag), None)
    if option is not None:
        assert option_value(config, option.path) == value
    elif flag == "--grpc-max-message-mb":
        assert security.max_message_bytes == int(value * (1 << 20))


def test_every_number_of_a_built_configuration_is_checked() -> None:
    """The net under the option rules: a NaN no option set (a configuration built in Python) is refused too."""
    config = CoordConfig()
    config.scheduler.retry_backoff = math.nan
    with pytest.raises(ValueError, match=r"configuration value scheduler.retry_backoff must be a finite number"):
        check_numbers(config)
    check_numbers(CoordConfig())


def test_config_show_reports_what_coord_would_refuse(tmp_path: Path) -> None:
    config = tmp_path / "q.toml"
    config.write_text(f'[etcd]\nendpoints = "{ETCD}"\n[coord]\nttl = nan\n')
    args = apply_layers(build_parser().parse_args(["config", "show", "--config", str(config)]), {})
    rows, error = config_rows(args)
    assert error == (f"configuration file {config}: [coord] ttl must be a finite number at least 2 and at most "
                     "3600, got nan")
    assert any(r["key"] == "coord.ttl" for r in rows)
    config.write_text(f'[etcd]\nendpoints = "{ETCD}"\n[auth]\ntokens_file = "{tmp_path / "nope.toml"}"\n')
    args = apply_layers(build_parser().parse_args(["config", "show", "--config", str(config)]), {})
    _, error = config_rows(args)
    assert error is not None and error.startswith(f"configuration file {config}: [auth] tokens_file cannot be read")


# ----- start-up of real processes: exit 2, one line naming key and source --------------------------------------------
async def run(*argv: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> tuple[int, str, str]:
    """``querycoord <argv>`` as a process; its exit status, stdout and stderr (killed if still running after
    ``timeout``: a process that accepted the setting would run on)."""
    base = {k: v for k, v in child_env().items() if not k.startswith("QUERYCOORD_") or k == "QUERYCOORD_ETCD_BIN"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "querycoord.cli", *argv,
                                                env={**base, **(env or {})}, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        return -9, out.decode(), err.decode()
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    empty_auth = tmp_path / "empty-auth.toml"
    empty_auth.write_text(f'[etcd]\nendpoints = "{ETCD}"\n[auth]\ntokens_file = ""\n')
    nan_ttl = tmp_path / "nan-ttl.toml"
    nan_ttl.write_text(f'[etcd]\nendpoints = "{ETCD}"\n[coord]\nttl = nan\n')
    return {"empty_auth": empty_auth, "nan_ttl": nan_ttl}


@pytest.mark.parametrize(("case", "argv", "env", "says"), [
    ("file", ["coord", "--config", "{empty_auth}"], {}, "error: configuration file {empty_auth}: [auth] tokens_file "
                                                        "is empty"),
    ("env", ["coord", "--etcd-endpoints", ETCD], {"QUERYCOORD_AUTH_TOKENS_FILE": ""},
     "error: $QUERYCOORD_AUTH_TOKENS_FILE is empty"),
    ("flag", ["coord", "--etcd-endpoints", ETCD, "--auth-tokens-file="], {}, "error: --auth-tokens-file is empty"),
    ("config show", ["config", "show", "--config", "{empty_auth}"], {},
     "error: `querycoord coord` would not start with this configuration: configuration file {empty_auth}: [auth] "
     "tokens_file is empty"),
    ("nan ttl", ["coord", "--config", "{nan_ttl}"], {},
     "error: configuration file {nan_ttl}: [coord] ttl must be a finite number at least 2 and at most 3600, got nan"),
    ("negative timeout", ["coord", "--etcd-endpoints", ETCD], {"QUERYCOORD_COORD_RPC_TIMEOUT": "-1"},
     "error: $QUERYCOORD_COORD_RPC_TIMEOUT must be more than 0, got -1"),
    ("infinite message size", ["coord", "--etcd-endpoints", ETCD, "--grpc-max-message-mb", "inf"], {},
     "error: --grpc-max-message-mb must be a finite number at least 0.01 and at most 2047, got inf"),
    ("node ttl", ["querynode", "--etcd-endpoints", ETCD, "--root", "r", "--ttl", "nan"], {},
     "error: querycoord querynode: argument --ttl: must be a finite number at least 2 and at most 3600, got nan"),
])
async def test_a_process_refuses_to_start_with_one_line(files: dict[str, Path], case: str, argv: list[str],
                                                         env: dict[str, str], says: str) -> None:
    argv = [a.format(**files) for a in argv]
    code, out, err = await run(*argv, env=env)
    assert code == 2, (case, code, out, err)
    assert err.startswith(says.format(**files)), (case, err)
    assert err.count("\n") == 1 and "Traceback" not in err, (case, err)
