"""What AutoGLM-Phone-9B's own phone agent sends, step by step (the engine tier's agent client
and the sessions benchmark both send it).

The shape of the Open-AutoGLM project's `phone_agent` loop: one English system prompt (about
2.6 KB: its rules and the action set), the same for every task; each step a user message with
the latest screenshot as an inline base64 PNG and a short `** Screen Info **` text (the first
step also carries the task); the screenshots of earlier steps are stripped from the history;
each answer is kept as `<think>...</think><answer>...</answer>`; every call streams with
temperature 0, top_p 0.85, frequency_penalty 0.2 and max_tokens 3000, and no session id.
"""

from __future__ import annotations

import base64
import io
import json
from typing import Any

MODEL = "autoglm-phone-9b"
SAMPLING = {"temperature": 0.0, "top_p": 0.85, "frequency_penalty": 0.2, "max_tokens": 3000}
TASK = "Open the Settings app, find Wi-Fi and turn it on, then go back to the home screen."

# The agent's rules and action set, written for these tests in the official prompt's shape
# and length (2.7 KB).
SYSTEM_PROMPT = """You are a phone operation agent. You see the current screen of an Android \
phone as a screenshot and decide the next single action that moves the user's task forward.

Answer in exactly this format:
<think>your reasoning about the screen and the next step, in one or two sentences</think>
<answer>one action</answer>

The actions you may use:
- do(action="Launch", app="xxx"): open an app by its name. Prefer this over finding its icon.
- do(action="Tap", element=[x,y]): tap a point. Coordinates run from [0,0] at the top left to \
[999,999] at the bottom right of the screen, whatever its resolution.
- do(action="Type", text="xxx"): type into the focused input field. Tap the field first.
- do(action="Swipe", start=[x1,y1], end=[x2,y2]): swipe, to scroll a list or move a page.
- do(action="Long Press", element=[x,y]): press and hold, to open a context menu.
- do(action="Double Tap", element=[x,y]): tap twice quickly, to zoom or select.
- do(action="Back"): go back one screen, or close a dialog or the keyboard.
- do(action="Home"): go to the home screen.
- do(action="Wait", duration="x seconds"): wait for a page or an animation to finish loading.
- do(action="Take_over", message="xxx"): ask the user to act, for a login, a payment or a \
verification code that you must not handle yourself.
- finish(message="xxx"): the task is done, or cannot be done; say which and why.

Rules:
1. Before anything else, check that the app in the foreground is the one the task needs. If not, \
launch it.
2. If a page shows nothing useful or is still loading, wait once, then go back and try another way.
3. If the element you need is not on the screen, swipe to look for it before you give up.
4. A popup, an advertisement or a permission dialog must be closed or answered first.
5. Never repeat an action that had no effect more than twice: change your approach.
6. Type only into a field you have tapped, and check the keyboard is open.
7. Tap the centre of an element, never its edge; small icons need care.
8. When a step fails, look at the screen again and explain what changed before you act.
9. Never guess a password, a verification code or payment details: hand over to the user.
10. When the task is done, check the screen shows it is done before you finish.
11. Keep the reasoning short: what you see, what it means for the task, what you do next.
12. One action per answer. Do not describe several steps at once.
13. Respect the user's privacy: do not open messages, photos or contacts the task does not need.
14. Some settings pages nest deeply; read the titles to know where you are.
15. If the screen is dark or locked, press Home and wait before anything else.

Today is Wednesday, 2 December 2026."""

# What the real model writes per step, 50 to 80 tokens each; the history keeps these.
AGENT_TURNS = [
    ("The home screen is showing and Settings is not open yet. The task needs the Settings app, "
     "so I launch it directly instead of looking for its icon.",
     'do(action="Launch", app="Settings")'),
    ("Settings is open on its main page. Network and internet is the third entry from the top; "
     "Wi-Fi lives inside it, so I tap that entry.",
     'do(action="Tap", element=[500,286])'),
    ("The Network and internet page lists Wi-Fi first, and its switch is off. I tap the row to "
     "open the Wi-Fi page where the switch and the networks are.",
     'do(action="Tap", element=[480,212])'),
    ("The Wi-Fi page is open and the main switch at the top reads Off. Turning it on is the "
     "step the task asks for, so I tap the switch on the right.",
     'do(action="Tap", element=[880,190])'),
]


def kept_turn(step: int) -> str:
    """The assistant turn the history keeps for `step`, as the agent writes it back."""
    think, action = AGENT_TURNS[step % len(AGENT_TURNS)]
    return f"<think>{think}</think><answer>{action}</answer>"


def screenshot(width: int, height: int, step: int) -> str:
    """A phone screen as an inline PNG, a little different each step."""
    from PIL import Image

    image = Image.new("RGB", (width, height), (236, 239, 241))
    image.paste((33, 150, 243), (0, 0, width, height // 12))  # the status and app bar
    for row in range(8):  # list rows, one of them highlighted by the step
        shade = (200, 230, 201) if row == step % 8 else (255, 255, 255)
        top = height // 6 + row * height // 10
        image.paste(shade, (width // 20, top, width - width // 20, top + height // 12))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def step_text(task: str, step: int) -> str:
    """The user text of a step: the task on the first, then the screen info."""
    info = "** Screen Info **\n\n" + json.dumps({"current_app": "Settings" if step else "Launcher"})
    return (f"{task}\n\n" if step == 0 else "") + info


def user_turn(task: str, step: int, image_url: str) -> dict[str, Any]:
    return {"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image_url}},
        {"type": "text", "text": step_text(task, step)},
    ]}  # fmt: skip


def strip_screenshots(messages: list[dict[str, Any]]) -> None:
    """Earlier steps keep their text only, as the agent sends its history."""
    for message in messages:
        if message["role"] == "user" and isinstance(message["content"], list):
            message["content"] = [p for p in message["content"] if p["type"] == "text"]
