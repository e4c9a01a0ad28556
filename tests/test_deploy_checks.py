"""``manage.py check --deploy`` warns of settings meant for tests or too weak for production
(workhorse.W101-W103), and only with ``--deploy``."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.checks import Warning, run_checks
from django.core.management import call_command
from django.test import override_settings

from django_workhorse.checks import check_deploy

STRONG_TOKEN = "Zq3-x8Lr_V1mN6tYb2Kc9PwE4sHd7Jf0aGu5"  # 36 characters, 36 distinct
DEPLOY_IDS = ("workhorse.W101", "workhorse.W102", "workhorse.W103")

UNSAFE = [
    pytest.param({"WORKHORSE_EAGER": True}, "workhorse.W101", "WORKHORSE_EAGER", id="eager"),
    pytest.param({"WORKHORSE_ALLOW_FUTURE_NOW": True}, "workhorse.W102", "WORKHORSE_ALLOW_FUTURE_NOW", id="future-now"),
    pytest.param(
        {"WORKHORSE_METRICS_TOKEN": "s3cr3t-but-short!"}, "workhorse.W103", "WORKHORSE_METRICS_TOKEN", id="short-token"
    ),
    pytest.param(
        {"WORKHORSE_METRICS_TOKEN": "ab" * 20}, "workhorse.W103", "WORKHORSE_METRICS_TOKEN", id="repetitive-token"
    ),
]


def deploy_ids(messages: list) -> list[str]:
    return [message.id for message in messages if message.id in DEPLOY_IDS]


def check_output(**options: object) -> str:
    out, err = StringIO(), StringIO()
    call_command("check", stdout=out, stderr=err, **options)
    return out.getvalue() + err.getvalue()


@pytest.mark.parametrize(("settings", "check_id", "setting"), UNSAFE)
def test_a_test_only_or_weak_setting_is_warned_of_with_its_name_and_a_hint(settings, check_id, setting):
    with override_settings(**settings):
        (warning,) = check_deploy()

    assert isinstance(warning, Warning)
    assert warning.id == check_id
    assert setting in warning.msg
    assert setting in warning.hint


@pytest.mark.parametrize(("settings", "check_id", "setting"), UNSAFE)
def test_manage_py_check_reports_it_with_deploy_only(settings, check_id, setting):
    with override_settings(**settings):
        assert check_id in check_output(deploy=True)
        assert deploy_ids(run_checks(include_deployment_checks=True)) == [check_id]
        assert check_id not in check_output()
        assert deploy_ids(run_checks()) == []


def test_the_defaults_give_no_deploy_warning_and_each_unsafe_value_gives_its_own():
    assert check_deploy() == []
    assert not any(check_id in check_output(deploy=True) for check_id in DEPLOY_IDS)
    with override_settings(WORKHORSE_METRICS_TOKEN=STRONG_TOKEN, WORKHORSE_EAGER_PROPAGATES=False):
        assert check_deploy() == []
    for unsafe in UNSAFE:
        settings, check_id, _ = unsafe.values
        with override_settings(**settings):
            assert deploy_ids(check_deploy()) == [check_id]


def test_every_unsafe_setting_at_once_gives_each_warning_once():
    with override_settings(WORKHORSE_EAGER=True, WORKHORSE_ALLOW_FUTURE_NOW=True, WORKHORSE_METRICS_TOKEN="x" * 40):
        assert deploy_ids(check_deploy()) == list(DEPLOY_IDS)


@pytest.mark.parametrize(
    ("weak", "strong"),
    [(STRONG_TOKEN[:31], STRONG_TOKEN[:32]), ("abcdefghi" * 4, "abcdefghij" * 4)],
    ids=["32-characters", "10-distinct-characters"],
)
def test_a_token_bound_at_its_edge_and_the_token_is_never_echoed(weak, strong):
    with override_settings(WORKHORSE_METRICS_TOKEN=weak):
        (warning,) = check_deploy()
    with override_settings(WORKHORSE_METRICS_TOKEN=strong):
        assert check_deploy() == []

    assert warning.id == "workhorse.W103"
    assert weak not in warning.msg and weak not in warning.hint


def test_a_token_e301_refuses_is_left_to_e301_and_one_it_accepts_may_be_weak():
    with override_settings(WORKHORSE_METRICS_TOKEN="short"):
        refused = [message.id for message in run_checks(include_deployment_checks=True)]
    with override_settings(WORKHORSE_METRICS_TOKEN="x" * 16):
        accepted = [message.id for message in run_checks(include_deployment_checks=True)]

    assert ("workhorse.E301" in refused, "workhorse.W103" in refused) == (True, False)
    assert ("workhorse.E301" in accepted, "workhorse.W103" in accepted) == (False, True)
