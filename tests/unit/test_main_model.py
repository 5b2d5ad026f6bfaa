"""Pure parts of app/main_model/service.py."""

from app.main_model.service import completion_budget


def test_no_max_tokens_is_the_rest_of_the_context() -> None:
    # vLLM's get_max_tokens: context - prompt when the request gives none (not 256).
    assert completion_budget(2048, 300, None, None, 4096) == 1748


def test_ceiling_and_request_bound_the_budget() -> None:
    assert completion_budget(2048, 300, None, None, 1000) == 1000
    assert completion_budget(2048, 300, 50, None, 1000) == 50
    assert completion_budget(2048, 2000, 500, None, 4096) == 48


def test_configured_default_applies_only_without_a_request_value() -> None:
    assert completion_budget(2048, 300, None, 256, 4096) == 256
    assert completion_budget(2048, 300, 600, 256, 4096) == 600
