"""The environment outcome types are ErrorType members (one name per concept), with their lanes, in one
host failure family with the egress broker's (``runtime.host_failures``)."""

from __future__ import annotations

import pytest

from sandforge.runtime.egress import errors as egress_errors
from sandforge.runtime.environments import errors as env_errors
from sandforge.runtime.host_failures import HostFailure, Lane, tables
from sandforge.runtime.store.health import classify_failure
from sandforge.runtime.store.models import FailureClass
from sandforge.sandbox import ErrorType
from sandforge.sandbox.protocol import RETRIABLE, RUNNER_ERROR_TYPES

ENVIRONMENT_KINDS = {
    "invalid_dependency_manifest",
    "dependency_policy_violation",
    "dependency_resolution_failed",
    "dependency_install_failed",
    "environment_preparing",
}


def test_each_environment_kind_is_an_error_type_member_with_one_class() -> None:
    assert set(env_errors.ERRORS) == ENVIRONMENT_KINDS
    for kind, cls in env_errors.ERRORS.items():
        assert cls.kind is ErrorType(kind)  # the member itself, not a look-alike string
        failure = cls("x")
        assert failure.kind is ErrorType(kind) and failure.reason == kind and isinstance(failure, HostFailure)


def test_the_lanes_agree_everywhere() -> None:
    """The family's lane, the sandbox's RETRIABLE set and the store's failure classes say the same thing."""
    for kind, lane in env_errors.LIFECYCLE.items():
        assert isinstance(lane, Lane) and not lane.terminal
        assert (ErrorType(kind) in RETRIABLE) is lane.retriable, kind
        extrinsic = classify_failure(kind) is FailureClass.EXTRINSIC
        assert extrinsic is lane.retriable is (not lane.counts_against_health), kind
    assert {"invalid_dependency_manifest", "dependency_policy_violation"} == env_errors.RECOVERABLE
    assert env_errors.LIFECYCLE["dependency_resolution_failed"] == (False, False, True)  # intrinsic


def test_the_inside_cannot_claim_an_environment_kind() -> None:
    """Only the host prepares environments: a runner's result frame naming one of these kinds is forged."""
    assert not {ErrorType(kind) for kind in ENVIRONMENT_KINDS} & RUNNER_ERROR_TYPES


def test_the_egress_family_keeps_its_kinds_and_lanes() -> None:
    assert {kind: tuple(lane) for kind, lane in egress_errors.LIFECYCLE.items()} == {
        "egress_denied": (True, False, False),
        "missing_credentials": (True, False, False),
        "network_error": (False, True, False),
        "egress_limit": (False, False, True),
        "invalid_fetch": (False, False, True),
    }
    for kind, cls in egress_errors.ERRORS.items():
        assert issubclass(cls, HostFailure) and ErrorType(kind).value == kind
        assert cls("m", reason="r").reason == "r"
    assert not set(egress_errors.ERRORS) & set(env_errors.ERRORS)


def test_a_family_with_two_classes_of_one_kind_is_refused() -> None:
    class Twin(env_errors.DependencyInstallFailed):
        pass

    with pytest.raises(ValueError, match="two failure classes"):
        tables((env_errors.DependencyInstallFailed, Twin))
