"""The child processes of ``bench.time_to_accuracy``: the starting model's held-out score
(``start``) and TRL's ``GRPOTrainer`` with the same held-out evaluation every few
generations (``trl``). Each writes one JSON file and is started by the bench, never by a
user.

The held-out evaluation is ppokit's own (:func:`ppokit.llm.training.heldout.score_policy`)
on the held-out rows ppokit's configuration gives, at the training temperature, with the
seed ppokit's trainer uses for its ``eval_every`` scores: the same function, rows and
random stream on every side, so the curves differ only by the policy being scored. The
clock of the curve counts training only: each evaluation is timed and left out.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
import warnings

import torch

EVAL_SEED_OFFSET = 7919  # ppokit's trainer scores held-out rows with seed + this


def _config(model_dir: str, seed: int, shared: dict):
    from ppokit.llm.training.config import LLMConfig

    return LLMConfig(algo="grpo", model=model_dir, task="numbers", seed=seed,
                     **shared).resolved()


def heldout(cfg):
    """ppokit's held-out rows and reward set for ``cfg`` (what its trainer scores)."""
    from ppokit.llm.inputs.reward_setup import reward_set
    from ppokit.llm.inputs.task import make_task
    from ppokit.llm.training.runfiles import prompt_sets

    task = make_task(cfg.task, cfg.task_options)
    rows = prompt_sets(cfg)[1][: cfg.n_eval_prompts]
    return rows, reward_set(cfg, None, task, log=lambda *a, **k: None), task


def score(model, tok, cfg, rows, rewards) -> dict:
    from ppokit.llm.training.heldout import score_policy

    was_training = model.training
    model.eval()
    try:
        out = score_policy(model, tok, rows, rewards, max_new_tokens=cfg.max_new_tokens,
                           temperature=cfg.temperature, seed=cfg.seed + EVAL_SEED_OFFSET)
    finally:
        model.train(was_training)
    return {"accuracy": out["score_mean"], "n": out["n"]}


def run_start(model_dir: str, seed: int, shared: dict) -> dict:
    """The starting model's held-out score (every row's point at 0 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = _config(model_dir, seed, shared)
    rows, rewards, _ = heldout(cfg)
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True,
                                                 dtype=torch.float32)
    return score(model, tok, cfg, rows, rewards)


def trl_config(cfg, out_dir: str, seed: int, precision: str, budget_s: float):
    """TRL's ``GRPOConfig`` doing the same work per generation as ppokit's ``cfg``: the
    same prompts per generation, completions per prompt, completion cap, temperature (no
    top-k/top-p), learning rate (constant, as ppokit's), minibatches per generation,
    passes, clip range, gradient clipping and β (0 on both sides: no reference model in
    TRL). TRL's own choices are kept where the bench does not need them equal (its loss
    ``dapo``, group-scaled rewards) and printed by the bench; gradient checkpointing off
    (TRL's default is on: off is faster here, the model fits)."""
    from trl import GRPOConfig

    n = cfg.prompts_per_iter * cfg.samples_per_prompt
    per_step = cfg.batch_size
    return GRPOConfig(
        output_dir=out_dir, seed=seed, per_device_train_batch_size=per_step,
        steps_per_generation=n // per_step, num_iterations=cfg.n_epochs,
        num_generations=cfg.samples_per_prompt, max_completion_length=cfg.max_new_tokens,
        max_steps=10**7, learning_rate=cfg.learning_rate, lr_scheduler_type="constant",
        warmup_steps=0, epsilon=cfg.clip_range, beta=cfg.kl_coef,
        max_grad_norm=cfg.max_grad_norm, temperature=cfg.temperature, top_p=1.0, top_k=0,
        gradient_checkpointing=False, bf16=precision == "bf16", use_cpu=True,
        logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True)


def _eval_callback(cfg, rows, rewards, tok, budget_s: float, per_generation: int,
                   curve: list):
    from transformers import TrainerCallback

    class EvalClock(TrainerCallback):
        """Held-out score every ``eval_every`` generations (``per_generation`` optimiser
        steps each), in float32, the format TRL generates in (its ``bf16=True`` autocasts
        the log-prob and training passes, not ``generate``); the clock counts training
        time only."""

        def on_train_begin(self, args, state, control, **kw):
            self.t0, self.paused = time.perf_counter(), 0.0

        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step % per_generation:  # (inside a generation's steps)
                return
            train_s = time.perf_counter() - self.t0 - self.paused
            generation = state.global_step // per_generation
            if generation % cfg.eval_every == 0 or train_s >= budget_s:
                t = time.perf_counter()
                curve.append({"train_s": train_s, "iteration": generation,
                              **score(model, tok, cfg, rows, rewards)})
                self.paused += time.perf_counter() - t
                print(json.dumps(curve[-1]), flush=True)
            if train_s >= budget_s:  # (as ppokit's time limit: at a generation's end)
                control.should_training_stop = True

    return EvalClock()


def run_trl(model_dir: str, seed: int, shared: dict, budget_s: float, precision: str) -> dict:
    """TRL's GRPO on ``model_dir`` for ``budget_s`` seconds of training, scored on the
    held-out rows every ``eval_every`` generations."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from ppokit.llm.inputs.chat_tasks import exact_answer

    cfg = _config(model_dir, seed, shared)
    rows, rewards, task = heldout(cfg)
    ds = Dataset.from_list([task.row(p) for p in task.train_prompts(20_000, random.Random(seed))])
    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)

    def correct(completions, answer, **_):
        return exact_answer(completions, answer)

    curve: list = []
    with tempfile.TemporaryDirectory(prefix="ppokit-tta-trl-") as tmp, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = trl_config(cfg, f"{tmp}/out", seed, precision, budget_s)
        steps_per_generation = args.steps_per_generation * args.num_iterations
        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules="all-linear", task_type="CAUSAL_LM")
        clock = _eval_callback(cfg, rows, rewards, tok, budget_s, steps_per_generation,
                               curve)
        trainer = GRPOTrainer(model=model_dir, reward_funcs=correct, args=args,
                              train_dataset=ds, processing_class=tok, peft_config=lora,
                              callbacks=[clock])
        trainer.train()
    return {"curve": curve, "loss_type": args.loss_type, "bf16": args.bf16,
            "scale_rewards": str(args.scale_rewards),
            "steps_per_generation": steps_per_generation}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench._tta_worker")
    ap.add_argument("mode", choices=("start", "trl"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--shared", required=True, help="the shared settings, a JSON object")
    ap.add_argument("--budget", type=float, default=0.0)
    ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    shared = json.loads(a.shared)
    out = (run_start(a.model, a.seed, shared) if a.mode == "start"
           else run_trl(a.model, a.seed, shared, a.budget, a.precision))
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f)
    os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
