"""The configuration layers (TOML file, ``QUERYCOORD_*`` variables, flags) and ``querycoord config show``.

The layers are parsed exactly as ``querycoord`` parses them (``build_parser``
then ``apply_layers``); the environment is passed explicitly where a test
needs one, so the machine's own variables cannot change the outcome.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from loguru import logger

from querycoord.cli import build_parser, main
from querycoord.settings.config_file import SETTINGS, ConfigError, Source, apply_layers, load_file
from querycoord.settings.coord_options import OPTIONS, config_from_args
from querycoord.settings.etcd_options import etcd_config_from_args

SECRET = "pw-never-printed-8731"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No QUERYCOORD_* variable of the machine leaks in; ``main`` reconfigures loguru, which is put back after."""
    for name in list(os.environ):
        if name.startswith("QUERYCOORD_") and name != "QUERYCOORD_ETCD_BIN":
            monkeypatch.delenv(name)
    yield
    logger.remove()
    logger.add(sys.stderr)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def parse(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    return apply_layers(build_parser().parse_args(argv), env or {})


def test_precedence_is_flag_then_env_then_file_then_default(tmp_path: Path) -> None:
    config = write(tmp_path / "q.toml", """
[coord]
ttl = 7
listen = "127.0.0.1:7001"
rpc-timeout = 3          # dashes and underscores both work
auto_balance_interval = 0
[etcd]
endpoints = ["127.0.0.1:2379", "127.0.0.2:2379"]
""")
    env = {"QUERYCOORD_COORD_TTL": "9", "QUERYCOORD_COORD_LISTEN": "127.0.0.1:8001",
           "QUERYCOORD_COORD_AUTO_BALANCE_INTERVAL": "30"}
    args = parse(["coord", "--config", str(config), "--ttl", "11"], env)
    cfg = config_from_args(args)
    assert (cfg.session_ttl, cfg.listen, cfg.rpc_timeout, cfg.checker_interval) == (11.0, "127.0.0.1:8001", 3.0, 5.0)
    assert cfg.auto_balance_interval == 30.0
    assert cfg.etcd.endpoints == ("127.0.0.1:2379", "127.0.0.2:2379")
    sources = args.config_sources
    assert sources["coord.ttl"] is Source.FLAG
    assert sources["coord.listen"] is Source.ENV
    assert sources["coord.rpc_timeout"] is Source.FILE
    assert sources["coord.checker_interval"] is Source.DEFAULT
    assert sources["etcd.endpoints"] is Source.FILE


def test_config_file_from_the_environment_and_global_or_after_the_command(tmp_path: Path) -> None:
    config = write(tmp_path / "q.toml", "[coord]\nroot = 'from-file'\n[log]\nlevel = 'debug'\nformat = 'json'\n")
    for argv, env in ((["coord"], {"QUERYCOORD_CONFIG": str(config)}),
                      (["--config", str(config), "coord"], {}),
                      (["coord", "--config", str(config)], {})):
        args = parse(argv, env)
        assert args.config_file == str(config)
        assert args.root == "from-file"
        assert (args.log_level, args.log_format) == ("debug", "json")
    # Log flags after the command win over the file, as flags do.
    args = parse(["coord", "--config", str(config), "--log-format", "text", "--log-level", "warning"])
    assert (args.log_level, args.log_format) == ("WARNING", "text")
    assert args.config_sources["log.format"] is Source.FLAG


def test_etcd_section_reaches_every_command_that_reaches_etcd(tmp_path: Path) -> None:
    """``[etcd]`` and ``[log]`` apply to the nodes too; ``[coord]`` only to the coordinator (a query node's
    --listen or --ttl is its own)."""
    pw = write(tmp_path / "pw", SECRET + "\n")
    ca = write(tmp_path / "ca.pem", "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")  # read, not used
    config = write(tmp_path / "q.toml", f"""
[coord]
listen = "127.0.0.1:7001"
ttl = 30
[etcd]
endpoints = "10.0.0.1:2379,10.0.0.2:2379"
cacert = "{ca}"
server_name = "etcd.example"
user = "querycoord"
password_file = "{pw}"
""")
    for role in ("querynode", "streamnode"):
        args = parse([role, "--config", str(config), "--root", "r"])
        etcd = etcd_config_from_args(args)
        assert etcd.endpoints == ("10.0.0.1:2379", "10.0.0.2:2379")
        assert (etcd.ca_file, etcd.tls_server_name, etcd.user, etcd.password) == (
            ca, "etcd.example", "querycoord", SECRET)
        assert args.ttl != 30
    assert parse(["querynode", "--config", str(config), "--root", "r"]).listen != "127.0.0.1:7001"


def test_password_from_env_beats_a_password_file_named_in_the_file(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pw = write(tmp_path / "pw", "from-file")
    config = write(tmp_path / "q.toml", f"[etcd]\nendpoints = '127.0.0.1:2379'\nuser = 'u'\npassword_file = '{pw}'\n")
    monkeypatch.setenv("QUERYCOORD_ETCD_PASSWORD", "from-env")
    args = parse(["coord", "--config", str(config)], dict(os.environ))
    assert etcd_config_from_args(args).password == "from-env"
    assert args.config_sources["etcd.password"] is Source.ENV
    # A password file named by a flag beats the variable.
    args = parse(["coord", "--config", str(config), "--etcd-password-file", str(pw)], dict(os.environ))
    assert etcd_config_from_args(args).password == "from-file"
    assert args.config_sources["etcd.password"] is Source.FLAG


@pytest.mark.parametrize(("text", "expected"), [
    ("[cord]\nttl = 3\n", "unknown section [cord]"),
    ("[coord]\nttll = 3\n", "unknown key 'ttll' in [coord]"),
    ("[etcd]\npassword = 'x'\n", "set password_file, or $QUERYCOORD_ETCD_PASSWORD"),
    ("[coord]\nttl = 'ten'\n", "[coord] ttl: expected a number, got 'ten'"),
    ("[coord]\nmax_request_bytes = 1.5\n", "[coord] max_request_bytes: expected an integer"),
    ("[coord]\nscaled = 'yes'\n", "[coord] scaled: expected true or false"),
    ("[log]\nformat = 'xml'\n", "[log] format: expected one of text, json, got 'xml'"),
    ("[coord\n", "is not valid TOML"),
])
def test_a_bad_file_is_an_error_naming_file_and_key(tmp_path: Path, text: str, expected: str) -> None:
    config = write(tmp_path / "q.toml", text)
    with pytest.raises(ConfigError) as e:
        load_file(config)
    assert expected in str(e.value)
    assert str(config) in str(e.value)


def test_a_bad_variable_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"\$QUERYCOORD_COORD_TTL: expected a number, got 'soon'"):
        parse(["coord"], {"QUERYCOORD_COORD_TTL": "soon"})
    with pytest.raises(ConfigError, match=r"\$QUERYCOORD_LOG_LEVEL: expected one of TRACE, .*, got 'loud'"):
        parse(["querynode", "--root", "r"], {"QUERYCOORD_LOG_LEVEL": "loud"})


def test_every_coord_and_etcd_option_is_a_file_key_and_a_variable() -> None:
    """Declared once: a new entry in the option tables is configurable everywhere without more code."""
    flags = {s.flag for s in SETTINGS}
    assert {o.flag for o in OPTIONS} <= flags
    assert {"--etcd-endpoints", "--etcd-cacert", "--etcd-cert", "--etcd-key", "--etcd-user",
            "--etcd-password-file", "--log-level", "--log-format", "--scaled"} <= flags
    names = {s.env for s in SETTINGS}
    assert {"QUERYCOORD_COORD_MAX_CONCURRENT_CHILDREN", "QUERYCOORD_ETCD_ENDPOINTS",
            "QUERYCOORD_ETCD_PASSWORD_FILE", "QUERYCOORD_LOG_LEVEL"} <= names


# ----- querycoord config show -----------------------------------------------------------------------------------
def test_config_show_prints_values_and_where_they_come_from(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    pw = write(tmp_path / "pw", SECRET)
    config = write(tmp_path / "q.toml", f"""
[coord]
root = "prod-a"
rpc_timeout = 4
[etcd]
endpoints = "127.0.0.1:2379"
user = "querycoord"
password_file = "{pw}"
""")
    monkeypatch.setenv("QUERYCOORD_COORD_LISTEN", "0.0.0.0:19531")
    monkeypatch.setenv("QUERYCOORD_ETCD_PASSWORD", SECRET + "-env")
    assert main(["config", "show", "--config", str(config), "--ttl", "12", "-o", "json"]) == 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    shown = json.loads(out)
    assert shown["config_file"] == str(config) and shown["error"] is None
    rows = {r["key"]: r for r in shown["settings"]}
    assert (rows["coord.root"]["value"], rows["coord.root"]["source"]) == ("prod-a", "file")
    assert (rows["coord.listen"]["value"], rows["coord.listen"]["source"]) == ("0.0.0.0:19531", "env")
    assert rows["coord.listen"]["origin"] == "env QUERYCOORD_COORD_LISTEN"
    assert (rows["coord.ttl"]["value"], rows["coord.ttl"]["origin"]) == (12.0, "flag --ttl")
    assert (rows["coord.rpc_timeout"]["value"], rows["coord.rpc_timeout"]["source"]) == (4.0, "file")
    assert (rows["coord.checker_interval"]["value"], rows["coord.checker_interval"]["source"]) == (5.0, "default")
    assert (rows["log.format"]["value"], rows["log.format"]["source"]) == ("text", "default")
    assert (rows["etcd.password"]["value"], rows["etcd.password"]["source"]) == ("(hidden)", "env")

    assert main(["config", "show", "--config", str(config)]) == 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert f"configuration file: {config}" in out
    line = next(x for x in out.splitlines() if x.startswith("coord.listen "))
    assert line.split() == ["coord.listen", "0.0.0.0:19531", "env", "QUERYCOORD_COORD_LISTEN"]
    assert next(x for x in out.splitlines() if x.startswith("etcd.password ")).split()[1] == "(hidden)"


def test_config_show_says_why_coord_would_not_start(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "show", "--etcd-endpoints", ","]) == 2
    out, err = capsys.readouterr()
    assert "etcd.endpoints" in out
    assert err.count("\n") == 1 and err.startswith("error: ") and "--etcd-endpoints: no etcd endpoint" in err
    assert main(["config", "show", "--etcd-endpoints", "127.0.0.1:2379", "--ttl", "1"]) == 2
    out, err = capsys.readouterr()
    assert "coord.ttl" in out
    assert err.count("\n") == 1 and "--ttl must be at least 2" in err


def test_a_bad_file_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(tmp_path / "missing.toml"), "config", "show"]) == 2
    _, err = capsys.readouterr()
    assert err.startswith("error: configuration file ") and "missing.toml" in err and err.count("\n") == 1
