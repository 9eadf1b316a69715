"""A tiny model of AutoGLM-Phone-9B's own architecture, made here and never downloaded.

AutoGLM-Phone-9B is GLM-4.1V-9B-Thinking's architecture (`Glm4vForConditionalGeneration`):
text 40 layers, hidden 4096, 32 heads, 2 KV heads, head dim 128, 65,536 positions, M-RoPE;
a vision tower with patch 14, spatial merge 2, temporal patch 2. This keeps every one of those
shapes that decides what vLLM does with a request (head dim, KV heads, positions, patch and
merge sizes, so a screenshot costs the same prompt tokens as on the real model) and shrinks the
rest: 2 text layers, hidden 256, 2 heads; a 2-layer vision tower.

Random weights never close a `<think>` block or emit an end token, so the model is trained for
a short while on the CPU to answer every prompt, text or screenshot, with one fixed agent turn
(ANSWER) and then GLM's end of turn `<|user|>`. Greedy decoding then gives that turn exactly,
which the reasoning parser (`glm45`) splits and the stop tests rely on. It shows behaviour, not
quality.

Cached under $AUTOGLM_CACHE/tiny-glm4v-<hash of this file>; a marker written last makes it
idempotent. Progress goes to stderr; the model directory is the last line on stdout.
Run it with the engine tier's environment (hack/vllm-cpu-env.sh), which has transformers.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

SEED = 0
THINK = "The search box is at the top of the screen; tap it first."
ACTION = 'do(action="Tap", element=[500,500])'
ANSWER = f"<think>{THINK}</think><answer>{ACTION}</answer>"
END_OF_TURN = "<|user|>"
# GLM-4.1V's special tokens (tokenizer_config.json), in its order.
SPECIAL_TOKENS = [
    "<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>",
    "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<|begin_of_image|>", "<|end_of_image|>", "<|begin_of_video|>", "<|end_of_video|>",
    "<|image|>", "<|video|>", "<|begin_of_box|>", "<|end_of_box|>",
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
    "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
]  # fmt: skip
# GLM's generation config stops at the end of text, the next user turn or an observation.
EOS_TOKENS = ["<|endoftext|>", "<|user|>", "<|observation|>"]
VOCAB_SIZE = 4096
# GLM-4.1V's chat template, cut to what the agent sends: system, user (text and images),
# assistant; `enable_thinking=false` pre-fills an empty think block, as GLM's template does.
CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' %}<|system|>\n"
    "{%- if m.content is string %}{{ m.content }}{%- else %}"
    "{%- for c in m.content %}{%- if c.type == 'text' %}{{ c.text }}{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{%- elif m.role == 'user' %}<|user|>\n"
    "{%- if m.content is string %}{{ m.content }}{%- else %}"
    "{%- for c in m.content %}"
    "{%- if c.type == 'image' or c.type == 'image_url' or 'image' in c %}"
    "<|begin_of_image|><|image|><|end_of_image|>"
    "{%- elif c.type == 'video' or 'video' in c %}<|begin_of_video|><|video|><|end_of_video|>"
    "{%- elif c.type == 'text' %}{{ c.text }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- elif m.role == 'assistant' %}<|assistant|>\n"
    "{%- if m.content is string %}{{ m.content }}{%- else %}"
    "{%- for c in m.content %}{%- if c.type == 'text' %}{{ c.text }}{%- endif %}{%- endfor %}"
    "{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think></think>{%- endif %}"
    "{%- endif %}"
)
CORPUS = (
    "open the settings app and turn on wifi search for coffee near me send a message to mom "
    "saying I will be late book a table for two at eight tonight play the next song take a "
    "screenshot scroll down to find the login button type hello world into the search box "
    "you are a phone agent each step you see the screen and answer with one action tap swipe "
    "long press back home launch wait note call api take over finish the current app is "
    "screen 1080 2400 element coordinates from 0 to 999 think first then act"
)
# English as a phone agent's prompts are written: its rules, actions, screens and answers. The
# BPE trained on it holds these words whole, as a real model's 150k-token vocabulary holds
# common English, so an agent prompt costs about the ~4 characters a token GLM's does (the
# engine tier's agent loop fills the context as the real model's would).
AGENT_ENGLISH = (
    "You are a phone operation agent. You see the current screen of an Android phone as a "
    "screenshot and decide the next single action that moves the user's task forward. Answer "
    "in exactly this format, with your reasoning about the screen and the next step in one or "
    "two sentences, then one action. The actions you may use: open an app by its name, prefer "
    "this over finding its icon; tap a point, coordinates run from the top left to the bottom "
    "right of the screen, whatever its resolution; type into the focused input field, tap the "
    "field first; swipe, to scroll a list or move a page; press and hold, to open a context "
    "menu; tap twice quickly, to zoom or select; go back one screen, or close a dialog or the "
    "keyboard; go to the home screen; wait for a page or an animation to finish loading; ask "
    "the user to act, for a login, a payment or a verification code that you must not handle "
    "yourself; the task is done, or cannot be done, say which and why. Rules: before anything "
    "else, check that the app in the foreground is the one the task needs. If not, launch it. "
    "If a page shows nothing useful or is still loading, wait once, then go back and try "
    "another way. If the element you need is not on the screen, swipe to look for it before "
    "you give up. A popup, an advertisement or a permission dialog must be closed or answered "
    "first. Never repeat an action that had no effect more than twice: change your approach. "
    "Type only into a field you have tapped, and check the keyboard is open. Tap the centre of "
    "an element, never its edge; small icons need care. When a step fails, look at the screen "
    "again and explain what changed before you act. Never guess a password, a verification "
    "code or payment details: hand over to the user. When the task is done, check the screen "
    "shows it is done before you finish. Keep the reasoning short: what you see, what it means "
    "for the task, what you do next. One action per answer. Do not describe several steps at "
    "once. Respect the user's privacy: do not open messages, photos or contacts the task does "
    "not need. Some settings pages nest deeply; read the titles to know where you are. If the "
    "screen is dark or locked, press home and wait before anything else. Today is Wednesday, "
    "the second of December. The home screen is showing and settings is not open yet. The "
    "task needs the settings app, so I launch it directly instead of looking for its icon. "
    "Settings is open on its main page. Network and internet is the third entry from the top; "
    "wifi lives inside it, so I tap that entry. The network page lists wifi first, and its "
    "switch is off. I tap the row to open the wifi page where the switch and the networks are. "
    "The wifi page is open and the main switch at the top reads off. Turning it on is the step "
    "the task asks for, so I tap the switch on the right. Launcher current app screen info"
)
WORDS = (CORPUS + " " + AGENT_ENGLISH).split()


def cache_dir() -> Path:
    root = Path(os.environ.get("AUTOGLM_CACHE", Path.home() / ".cache" / "autoglm"))
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    return root / f"tiny-glm4v-{digest}"


def log(message: str) -> None:
    print(f"[tiny-glm4v] {message}", file=sys.stderr, flush=True)


def build_tokenizer(out: Path):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(WORDS), AGENT_ENGLISH, ANSWER, ACTION, THINK] + [
        " ".join(random.Random(i).choices(WORDS, k=40)) for i in range(200)
    ]
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:], chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )
    fast.save_pretrained(out)
    return fast


def build_processor(out: Path, tokenizer):  # -> Glm4vProcessor
    from transformers import Glm4vImageProcessor, Glm4vProcessor, Glm4vVideoProcessor

    # GLM-4.1V's defaults: patch 14, merge 2, temporal patch 2, so 28x28 pixels a token.
    processor = Glm4vProcessor(
        image_processor=Glm4vImageProcessor(), tokenizer=tokenizer,
        video_processor=Glm4vVideoProcessor(), chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out)
    return processor


def build_config(tokenizer):  # -> Glm4vConfig
    from transformers import Glm4vConfig

    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    return Glm4vConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
            "head_dim": 128,  # the 9B's; the CPU attention kernels refuse small ones (16)
            "max_position_embeddings": 65536, "attention_bias": True,
            "partial_rotary_factor": 0.5,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                "mrope_section": [8, 12, 12]},
            "eos_token_id": [ids[t] for t in EOS_TOKENS], "pad_token_id": ids["<|endoftext|>"],
            "tie_word_embeddings": False,
        },
        vision_config={
            "depth": 2, "hidden_size": 256, "num_heads": 2, "intermediate_size": 512,
            "out_hidden_size": 256, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "image_size": 336,
        },
        image_token_id=ids["<|image|>"], video_token_id=ids["<|video|>"],
        image_start_token_id=ids["<|begin_of_image|>"],
        image_end_token_id=ids["<|end_of_image|>"],
        video_start_token_id=ids["<|begin_of_video|>"],
        video_end_token_id=ids["<|end_of_video|>"],
        eos_token_id=[ids[t] for t in EOS_TOKENS], pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=False,
    )


def png(width: int, height: int, rng: random.Random) -> bytes:
    from PIL import Image

    colour = tuple(rng.randrange(256) for _ in range(3))
    image = Image.new("RGB", (width, height), colour)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def sample_messages(rng: random.Random) -> tuple[list[dict], object | None]:
    """A chat as the agent (or a plain chat client) sends it, and its screenshot if any."""
    def words(most: int) -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(1, most)))

    messages: list[dict] = []
    if rng.random() < 0.6:
        messages.append({"role": "system", "content": words(400)})
    for _ in range(rng.choice((0, 0, 1, 2))):
        messages += [{"role": "user", "content": words(30)},
                     {"role": "assistant", "content": ANSWER}]
    image = None
    # Mostly small screenshots (the vision tower is the slow part of a step on a CPU), and
    # the agent's 540x1200 (~830 tokens): small ones alone leave a long image prompt's turn
    # repeating its think block.
    if rng.random() < 0.2:
        from PIL import Image

        width, height = rng.choice(((112, 112), (168, 336), (280, 616), (540, 1200)))
        image = Image.open(io.BytesIO(png(width, height, rng)))
        content: object = [{"type": "image"}, {"type": "text", "text": words(60)}]
    else:
        content = words(60)
    messages.append({"role": "user", "content": content})
    return messages, image


def train(model, processor, tokenizer, steps: int) -> float:
    import torch

    rng = random.Random(SEED)
    target = tokenizer(ANSWER + END_OF_TURN, add_special_tokens=False)["input_ids"]
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3)
    # Warm up, then decay to zero: a constant rate spikes the loss late and unlearns the turn.
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: min(1.0, (step + 1) / 10) * (1 - step / steps))
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        messages, image = sample_messages(rng)
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        if image is not None:
            inputs = processor(text=[prompt], images=[image], return_tensors="pt")
        else:
            inputs = processor(text=[prompt], return_tensors="pt")
        prompt_len = inputs["input_ids"].shape[1]
        answer = torch.tensor([target])
        for key in ("attention_mask", "mm_token_type_ids", "token_type_ids"):
            if key in inputs:  # per-token: the answer is text, attended to
                fill = torch.ones_like(answer) if key == "attention_mask" else answer * 0
                inputs[key] = torch.cat([inputs[key], fill], dim=1)
        inputs["input_ids"] = torch.cat([inputs["input_ids"], answer], dim=1)
        labels = inputs["input_ids"].clone()
        labels[:, :prompt_len] = -100
        loss = model(**inputs, labels=labels).loss
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        loss_value = loss.item()
        if step % 25 == 0 or step == steps - 1:
            log(f"step {step + 1}/{steps}: loss {loss_value:.4f}")
    model.eval()
    return loss_value


def greedy_answer(model, processor, tokenizer, messages, image) -> str:
    import torch

    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    images = [image] if image is not None else None
    inputs = processor(text=[prompt], images=images, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=64, do_sample=False)
    return tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=False)


def build(out: Path) -> None:
    import torch
    from transformers import Glm4vForConditionalGeneration

    random.seed(SEED)
    torch.manual_seed(SEED)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tokenizer = build_tokenizer(out)
    processor = build_processor(out, tokenizer)
    config = build_config(tokenizer)
    model = Glm4vForConditionalGeneration(config)
    log(f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters; training ...")
    loss = train(model, processor, tokenizer, steps=int(os.environ.get("TINY_GLM4V_STEPS", 300)))
    rng = random.Random(SEED + 1)
    for _ in range(4):  # held-out prompts: the fixed turn and its end, exactly
        messages, image = sample_messages(rng)
        got = greedy_answer(model, processor, tokenizer, messages, image)
        if not got.startswith(ANSWER + END_OF_TURN):
            raise SystemExit(f"training did not take (loss {loss:.4f}): greedy gave {got!r}")
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    (out / "tiny_glm4v.json").write_text(json.dumps(
        {"answer": ANSWER, "endOfTurn": END_OF_TURN, "seed": SEED, "finalLoss": loss}, indent=2))


def main() -> int:
    out = cache_dir()
    marker = out / ".complete"
    if marker.exists():
        print(out)
        return 0
    started = time.monotonic()
    log(f"building {out} ...")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    build(partial)
    (partial / ".complete").write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    log(f"ready in {time.monotonic() - started:.0f}s: {out}")
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
