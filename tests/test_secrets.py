"""What the service prints of an error or a text that may hold a secret (chatops/secrets.py): one readable line,
with every secret the process knows masked."""

from __future__ import annotations

import dataclasses
import json
import socket

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import OperationalError

from chatops.config import Config, load_config
from chatops.secrets import MASK, LiveSecrets, describe_error, mask_url, scrub, secrets_of, with_json_forms
from mm_testkit.ports import free_port


def raised(action) -> BaseException:
    with pytest.raises(Exception) as caught:
        action()
    return caught.value


def test_a_database_that_refuses_the_connection_reads_connection_refused() -> None:
    engine = create_engine(f"postgresql+psycopg://mm@127.0.0.1:{free_port()}/mm")
    error = raised(engine.connect)
    assert isinstance(error, OperationalError) and "\n" in str(error)  # SQLAlchemy's wrapping, several lines
    assert describe_error(error) == "connection refused"


def test_an_os_error_reads_without_its_errno_prefix() -> None:
    error = raised(lambda: open("/nonexistent-mm-dir/config.yaml"))  # noqa: SIM115 - it raises
    assert str(error).startswith("[Errno 2] ")
    assert describe_error(error) == "No such file or directory: '/nonexistent-mm-dir/config.yaml'"
    unresolved = socket.gaierror(-2, "Name or service not known")  # as getaddrinfo raises it, errno negative
    assert describe_error(unresolved) == "Name or service not known"


def test_an_error_reads_as_its_first_line_or_its_kind_when_it_says_nothing() -> None:
    assert describe_error(RuntimeError("  the model answered 500\ntraceback follows\n")) == "the model answered 500"
    assert describe_error(TimeoutError()) == "TimeoutError"
    assert describe_error(ValueError("   ")) == "ValueError"
    # A message that only mentions an errno further on keeps it.
    assert describe_error(RuntimeError("git said [Errno 5] at the end")) == "git said [Errno 5] at the end"


def config(**values: str) -> Config:
    base = load_config(None, environ={"SLACK_BOT_TOKEN": "xoxb-1", "SLACK_SIGNING_SECRET": "s" * 32})
    return dataclasses.replace(base, **values)


def test_the_secrets_a_process_knows_include_passwords_in_its_urls_longest_first() -> None:
    known = secrets_of(
        config(
            database_url="postgresql://mm:db-password@db/mm",
            broker_url="redis://:broker-pw@redis:6379/0",
            model_api_key="sk-model-key",
            slack_api_url="https://mm:slack-api-pw@slack.internal.example/api/",
            git_token="abc",  # too short to mask without masking every "abc" in every text
        )
    )
    assert {"db-password", "broker-pw", "slack-api-pw", "sk-model-key", "xoxb-1", "s" * 32} <= set(known)
    assert "abc" not in known
    assert known == sorted(known, key=len, reverse=True)


def test_a_secret_that_contains_another_is_masked_whole() -> None:
    assert scrub("token=xoxb-1-longer and xoxb-1", ["xoxb-1-longer", "xoxb-1"]) == f"token={MASK} and {MASK}"


def test_a_secret_inside_a_json_text_is_masked_in_its_escaped_form() -> None:
    for secret in ('pa"ss\\word', "ends-in\\"):  # the second: its plain form is in its escaped one, masked first
        arguments = json.dumps({"command": f"curl -u me:{secret} https://example.com"})
        masked = scrub(arguments, with_json_forms([secret, ""]))
        assert json.loads(masked) == {"command": f"curl -u me:{MASK} https://example.com"}


def test_a_reloaded_config_brings_its_new_secrets_and_keeps_the_old_ones_masked() -> None:
    current = [config(model_api_key="sk-first-key")]
    live = LiveSecrets(lambda: current[0])
    current[0] = config(model_api_key="sk-second-key-longer")
    known = live()
    assert {"sk-first-key", "sk-second-key-longer"} <= set(known)
    assert list(known) == sorted(known, key=len, reverse=True)  # so that one containing another is masked whole


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("sqlite:///./var/mm.sqlite3", "sqlite:///./var/mm.sqlite3"),
        ("postgresql+psycopg://u:p%40ss@db:5432/mm", "postgresql+psycopg://u:***@db:5432/mm"),
        ("redis://:pw@localhost:6379/0", "redis://:***@localhost:6379/0"),
        ("http://h/v1?api_key=abc&x=1", "http://h/v1?api_key=***&x=1"),
        ("http://h/v1?a=&token=abc", "http://h/v1?a=&token=***"),  # a blank value stays, as written
        ("http://[::1", "<unparsable URL>"),
    ],
)
def test_a_url_is_shown_with_its_password_and_secret_parameters_masked(url: str, masked: str) -> None:
    assert mask_url(url) == masked
