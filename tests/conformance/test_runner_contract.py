"""The runner contract under each tier: results, labels and hardening, exit codes,
deadlines, cancels, OOM kills, adoption, floods, disk fills and silences (the integration
tests of the Docker adapter, run again with the tier's runtime)."""

from __future__ import annotations

import pytest

from tests.integration.docker.test_docker_runner import (
    either_runner,
    test_adoption__exited_container_is_finalized_from_its_outputs,
    test_adoption__running_container_is_waited_on_not_restarted,
    test_cancel__stops_the_container,
    test_echo__result_labels_name_and_hardening,
    test_failure__exit_code_and_stderr,
    test_fork_bomb__ends_cleanly_and_host_stays_healthy,
    test_live_container__has_no_docker_socket_and_no_host_mounts,
    test_no_result_file__succeeds_with_null_result,
    test_oom__is_reported_as_such,
    test_result__invalid_results_are_rejected,
    test_sigkill_by_the_tool_itself__is_no_oom,
    test_timeout__stops_the_container_at_the_deadline,
    test_tool_sandbox__cannot_write_root_input_or_reach_network,
)
from tests.integration.docker.test_tool_isolation_docker import (
    secret_file,
    test_secrets__reach_the_tool_and_are_masked_in_logs_chunks_and_result,
)
from tests.integration.docker.test_tool_limits_docker import (
    limited_runner,
    test_disk_limit__a_fill_is_stopped_and_named,
    test_idle_timeout__a_silent_tool_is_warned_then_stopped,
)

pytestmark = pytest.mark.docker

__all__ = [
    "either_runner",
    "limited_runner",
    "secret_file",
    "test_adoption__exited_container_is_finalized_from_its_outputs",
    "test_adoption__running_container_is_waited_on_not_restarted",
    "test_cancel__stops_the_container",
    "test_disk_limit__a_fill_is_stopped_and_named",
    "test_echo__result_labels_name_and_hardening",
    "test_failure__exit_code_and_stderr",
    "test_fork_bomb__ends_cleanly_and_host_stays_healthy",
    "test_idle_timeout__a_silent_tool_is_warned_then_stopped",
    "test_live_container__has_no_docker_socket_and_no_host_mounts",
    "test_no_result_file__succeeds_with_null_result",
    "test_oom__is_reported_as_such",
    "test_result__invalid_results_are_rejected",
    "test_secrets__reach_the_tool_and_are_masked_in_logs_chunks_and_result",
    "test_sigkill_by_the_tool_itself__is_no_oom",
    "test_timeout__stops_the_container_at_the_deadline",
    "test_tool_sandbox__cannot_write_root_input_or_reach_network",
]
