"""normalize_host: plain HTTP for loopback hosts only, whatever their spelling."""
import pytest
from switchboard_client import config
from switchboard_client.config import normalize_host


@pytest.mark.parametrize(("given", "expected"), [
    ("127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("localhost:8000", "http://localhost:8000"),
    ("localhost", "http://localhost"),
    ("[::1]:8000", "http://[::1]:8000"),
    ("[::1]", "http://[::1]"),
    ("LocalHost:8000/", "http://LocalHost:8000"),
    ("example.org", "https://example.org"),
    ("example.org:8443", "https://example.org:8443"),
    ("localhost.example.org", "https://localhost.example.org"),
    ("[2001:db8::1]:8000", "https://[2001:db8::1]:8000"),
    ("[::1", "https://[::1"),
    ("http://example.org/", "http://example.org"),
    ("https://127.0.0.1:8000", "https://127.0.0.1:8000"),
])
def test_loopback_hosts_default_to_http_and_the_rest_to_https(given, expected):
    assert normalize_host(given) == expected


def test_the_token_variable_goes_only_to_the_host_reached_without_host(monkeypatch, tmp_path):
    # given: the variables name one server, and a login stored for another
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    config.store_token("https://other.example", "sbt_stored")
    monkeypatch.setenv("SWITCHBOARD_URL", "switchboard.example")
    monkeypatch.setenv("SWITCHBOARD_TOKEN", "sbt_variable")
    # then: the variable's token goes to its own host, named or not
    assert config.resolve() == ("https://switchboard.example", "sbt_variable")
    assert config.resolve("https://switchboard.example/") == ("https://switchboard.example", "sbt_variable")
    # and a --host elsewhere gets its stored token, or none
    assert config.resolve("other.example") == ("https://other.example", "sbt_stored")
    assert config.resolve("attacker.example") == ("https://attacker.example", None)
    # without $SWITCHBOARD_URL, the variable's token is the local default's, even
    # where the host reached without --host is the last login's
    monkeypatch.delenv("SWITCHBOARD_URL")
    assert config.resolve() == ("https://other.example", "sbt_stored")
    assert config.resolve("127.0.0.1:8000") == ("http://127.0.0.1:8000", "sbt_variable")
    assert config.resolve("attacker.example") == ("https://attacker.example", None)


def test_a_library_client_sends_the_token_variable_only_to_its_own_host(monkeypatch):
    from switchboard_client import Client

    monkeypatch.setenv("SWITCHBOARD_URL", "https://switchboard.example")
    monkeypatch.setenv("SWITCHBOARD_TOKEN", "sbt_variable")
    assert Client().transport.token == "sbt_variable"
    assert Client("https://switchboard.example/").transport.token == "sbt_variable"
    assert Client("https://attacker.example").transport.token is None
    assert Client("https://attacker.example", token="sbt_given").transport.token == "sbt_given"


@pytest.mark.parametrize("text", ['{"hosts": ', '{"hosts": []}', '["a"]', '{"hosts": {"h": "t"}}', "\udcff"])
def test_an_unreadable_config_is_one_line_and_a_login_writes_it_again(monkeypatch, tmp_path, capsys, text):
    # (each was a traceback from every command, login included)
    from switchboard_client import cli

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("SWITCHBOARD_TOKEN", raising=False)
    config.config_path().parent.mkdir(parents=True)
    config.config_path().write_bytes(text.encode("utf-8", "surrogateescape"))
    assert cli.main(["whoami"]) == cli.EXIT_USAGE
    assert "cannot be read" in capsys.readouterr().err
    config.store_token("http://127.0.0.1:9", "sbt_new")
    assert config.resolve("http://127.0.0.1:9") == ("http://127.0.0.1:9", "sbt_new")


@pytest.mark.parametrize("token", ["sbt_é", "sbt_\u2026", "sbt_a\nb"])
def test_a_token_that_cannot_go_in_a_header_is_refused_before_anything_is_sent(token):
    from switchboard_client import Client, errors

    with pytest.raises(errors.ConfigurationError):
        Client("http://127.0.0.1:9", token)


def test_a_base_url_without_a_scheme_is_read_as_a_host_is():
    # (it was sent as it was, refused by httpx as no protocol, retried five times and reported as sent)
    from switchboard_client import Client

    assert Client("127.0.0.1:8140", "sbt_x").transport.base_url == "http://127.0.0.1:8140"
