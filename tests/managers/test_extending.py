"""The manager of one's own that ``docs/extending.md`` shows, run as written: its code block is the
contract a user copies, so it is loaded from the page, registered, and scores through verl's path
(``run_single`` on a real ``DataProto`` item) with the statuses every manager gives."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

from tests.managers.test_managers import FAST_RETRY, score_rows

PAGE = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
#: What the example calls: a stand-in for the user's own service client (the one part a user writes).
CLIENT = """
class _Client:
    async def grade(self, text):
        if "boom" in text:
            raise RuntimeError("the service is down")
        return len(text) / 100


my_client = _Client()
"""


def _load_example(tmp_path: Path) -> Any:
    code = re.search(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    assert code is not None, "docs/extending.md lost its example"
    path = tmp_path / "my_service_manager.py"
    path.write_text(CLIENT + "\n" + code.group(1))
    spec = importlib.util.spec_from_file_location("my_service_manager", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_documented_example_registers_and_scores_with_statuses(
    tmp_path, verl_config_factory, tokenizer, batch_factory
):
    from verl.experimental.reward_loop.reward_manager.registry import REWARD_MANAGER

    from async_reward import AsyncRewardManager

    module = _load_example(tmp_path)
    manager_cls = module.MyServiceManager
    assert issubclass(manager_cls, AsyncRewardManager) and REWARD_MANAGER["my_service"] is manager_cls
    config = verl_config_factory("my_service", {"retry": FAST_RETRY, "fallback_score": -1.0})
    manager = manager_cls(config, tokenizer)
    fine, down = "The answer is 12", "boom 12"
    outputs = await score_rows(
        manager,
        batch_factory,
        [{"response": fine, "ground_truth": "12"}, {"response": down, "ground_truth": "1"}],
    )
    assert float(outputs[0]["reward_score"]) == len(fine) / 100
    assert outputs[0]["reward_extra_info"]["status"] == "ok"
    # A raising service is a failed sample with its reason and the configured fallback, after retries.
    assert outputs[1]["reward_extra_info"]["status"] == "error"
    assert float(outputs[1]["reward_score"]) == -1.0
    assert "the service is down" in str(outputs[1]["reward_extra_info"])
