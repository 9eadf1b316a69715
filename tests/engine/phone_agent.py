"""A client that runs the phone agent's loop (testkit.agent's request shape) with the official
`openai` client.

The tiny test model answers every step with one short fixed turn (~30 tokens); the history
keeps turns of the length the real model writes (testkit.agent.AGENT_TURNS, 50 to 80 tokens),
so the context fills as it does in production.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from openai import OpenAI

from testkit import agent


@dataclass
class Step:
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    reasoning: str
    content: str


@dataclass
class PhoneAgent:
    client: OpenAI
    width: int = 1080
    height: int = 2400
    messages: list[dict[str, Any]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.messages = [{"role": "system", "content": agent.SYSTEM_PROMPT}]

    def step(self) -> Step:
        """One turn of the loop: strip the last screenshot, send the new one, keep the answer.
        An error from the server (openai.BadRequestError) leaves the history as it was."""
        n = len(self.steps)
        agent.strip_screenshots(self.messages)
        user = agent.user_turn(agent.TASK, n, agent.screenshot(self.width, self.height, n))
        stream = self.client.chat.completions.create(
            model=agent.MODEL, messages=[*self.messages, user], stream=True,
            stream_options={"include_usage": True}, **agent.SAMPLING)
        reasoning, content, finish, usage = "", "", None, None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                reasoning += (choice.delta.model_extra or {}).get("reasoning") or ""
                content += choice.delta.content or ""
                finish = choice.finish_reason or finish
        assert usage is not None, "the stream carried no usage"
        self.messages += [user, {"role": "assistant", "content": agent.kept_turn(n)}]
        done = Step(usage.prompt_tokens, usage.completion_tokens, finish, reasoning, content)
        self.steps.append(done)
        return done
