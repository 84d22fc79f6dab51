"""The openai agent: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama, ...).

program.md is the system message; the kernel, its reference, the recent results and the last bench
output are the user message. The python code block of the reply becomes kernel.py. The `openai`
package is used when it is installed (the `llm` extra), else plain urllib speaks the same protocol;
neither is imported before the first request. Transient failures (5xx, 429, timeouts, refused
connections) are retried with exponential backoff; when the retries run out, or on an error that
retrying cannot fix (401, 404), the loop stops with the endpoint's own message. A reply without a
usable code block fails that experiment only. There is never a silent fallback to another agent.
"""

from __future__ import annotations

import ast
import json
import os
import re
import time
import urllib.error
import urllib.request

from autokernel.kernelfile import KernelFileError, kernel_type
from autokernel.loop import agents
from autokernel.loop.agents import Agent, AgentError, AgentUnavailable, Proposal, Task

DEFAULT_BASE_URL = "https://api.openai.com/v1"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
REQUEST_TIMEOUT_S = 600  # one completion; reasoning models can think for minutes
RETRIES = 4  # transient failures retried before the loop gives up on the endpoint
BACKOFF_S = 2.0  # first wait; doubles on each retry
TEMPERATURE = 0.7  # some variety between experiments, still mostly sensible code

_CODE_BLOCK = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.S | re.I)


class _Transient(Exception):
    """Worth retrying: the endpoint may answer next time."""


def extract_kernel(reply: str, want_type: str) -> str:
    """The code block of the reply that is a whole kernel file of the right type."""
    blocks = _CODE_BLOCK.findall(reply or "")
    for code in sorted(blocks, key=len, reverse=True):
        try:
            found_type = kernel_type(code)
            has_fn = any(isinstance(n, ast.FunctionDef) and n.name == "kernel_fn" for n in ast.parse(code).body)
        except (KernelFileError, SyntaxError):
            continue
        if found_type == want_type and has_fn:
            return code.rstrip() + "\n"
    raise AgentError(f"malformed reply: no ```python block holding a whole kernel.py "
                     f"(KERNEL_TYPE = \"{want_type}\" and kernel_fn) among {len(blocks)} code blocks")


class ChatAgent(Agent):
    name = "openai"

    def __init__(self, model: str, base_url: str = DEFAULT_BASE_URL, api_key_env: str = DEFAULT_KEY_ENV,
                 timeout_s: float = REQUEST_TIMEOUT_S, retries: int = RETRIES, backoff_s: float = BACKOFF_S,
                 transport: str = "auto"):
        if not model:
            raise AgentUnavailable("the openai agent needs --model (the name the endpoint serves)")
        self.model, self.base_url = model, base_url.rstrip("/")
        self.api_key = os.environ.get(api_key_env, "")
        if not self.api_key and self.base_url == DEFAULT_BASE_URL:
            raise AgentUnavailable(f"no API key: set {api_key_env} (or --api-key-env NAME), or point "
                                   "--base-url at a local server")
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self.transport = transport

    def propose(self, task: Task) -> Proposal:
        program = agents.read_program(task.root)
        messages = [{"role": "system", "content": program},
                    {"role": "user", "content": agents.build_prompt(task, program="", edit_in_place=False)}]
        reply = self.complete(messages)
        task.log_dir.mkdir(parents=True, exist_ok=True)
        log = task.log_dir / f"exp{task.experiment:04d}_{task.kernel_name}.reply.md"
        log.write_text(reply)
        code = extract_kernel(reply, task.kernel_type)
        task.kernel_file.write_text(code)
        prose = _CODE_BLOCK.sub("", reply).strip().splitlines()
        return Proposal(agents.find_description(reply, prose[0] if prose else "edit by the openai agent"),
                        {"log": str(log.relative_to(task.root))})

    def complete(self, messages: list[dict]) -> str:
        """The reply's text, retrying transient failures with exponential backoff."""
        for attempt in range(self.retries + 1):
            try:
                return self._request(messages)
            except _Transient as e:
                if attempt == self.retries:
                    raise AgentUnavailable(f"{self.base_url} failed {attempt + 1} times, last: {e}") from None
                time.sleep(self.backoff_s * 2 ** attempt)
        raise AssertionError("unreachable")

    def _request(self, messages: list[dict]) -> str:
        use_package = self.transport == "openai"
        if self.transport == "auto":
            try:
                import openai  # noqa: F401  (the optional `llm` extra)
                use_package = True
            except ImportError:
                use_package = False
        return self._via_package(messages) if use_package else self._via_urllib(messages)

    def _via_package(self, messages: list[dict]) -> str:
        import openai

        client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key or "none",
                               timeout=self.timeout_s, max_retries=0)  # retries are ours, one policy
        try:
            reply = client.chat.completions.create(model=self.model, messages=messages,
                                                   temperature=TEMPERATURE)
        except openai.APIStatusError as e:
            _raise_for_status(e.status_code, str(e))
        except (openai.APITimeoutError, openai.APIConnectionError) as e:
            raise _Transient(f"cannot reach {self.base_url}: {e}") from None
        return _content(reply.model_dump())

    def _via_urllib(self, messages: list[dict]) -> str:
        body = json.dumps({"model": self.model, "messages": messages, "temperature": TEMPERATURE}).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(f"{self.base_url}/chat/completions", body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            _raise_for_status(e.code, e.read().decode("utf-8", "replace")[:500])
        except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
            raise _Transient(f"cannot reach {self.base_url}: {getattr(e, 'reason', e)}") from None
        try:
            return _content(json.loads(text))
        except json.JSONDecodeError:
            raise AgentError(f"malformed reply: the endpoint answered non-JSON: {text[:200]!r}") from None


def _raise_for_status(status: int, message: str):
    if status >= 500 or status == 429:
        raise _Transient(f"HTTP {status}: {message}")
    raise AgentUnavailable(f"the endpoint refused the request (HTTP {status}): {message}")


def _content(payload: dict) -> str:
    try:
        return payload["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise AgentError(f"malformed reply: no choices[0].message.content in {str(payload)[:200]}") from None
