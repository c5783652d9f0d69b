"""Figures for the approval policy's matcher (not a test): what judging a call costs, for the commands a model
writes and for hostile command lines at n and 4n repetitions side by side, so a reading that grows faster than
the text (a pipeline or a list of thousands of commands once did: tree-sitter's `parent` walks down from the root)
shows as a ratio far above 4. The agent judges a call off its event loop (mm_core/agent.py), so even the worst
of these (a second or two at the 100,000-character bound, on two busy cores) holds one thread, not the worker's
other turns.

Run: .venv/bin/python bench/bench_policy.py
"""

from __future__ import annotations

import time

from mm_core.policy import Rule, judge

RULES = [
    Rule(name="root wipe", tool="bash", commands=["rm -rf /", "rm -rf /*"], deny=True),
    Rule(name="two-person push", tool="bash", commands=["git push", "git push *"], ask=2),
    Rule(name="CI files", paths=[".github/**", "Dockerfile", "*.tf"], ask=2),
    Rule(name="looking around", tool="bash", allow=True, commands=["ls*", "cat *", "grep *", "git status*"]),
]
EVERYDAY = [
    "git status",
    "cd src && pytest -q tests/test_x.py 2>&1 | tail -20",
    "git add -A && git commit -m 'fix: things' && git push origin HEAD:feature",
    'for f in $(ls); do echo "$f"; done',
]
# Hostile shapes, each made of `n` repetitions (the bound is 100,000 characters: 4n stays under it).
HOSTILE = {
    "pipeline a|a|…": lambda n: "a|" * n + "b",
    "list a && a && …": lambda n: "a && " * n + "b",
    "sequence a;a;…": lambda n: "a;" * n,
    "computed words $a$a…": lambda n: "echo " + "$a" * n,
    "quoted words 'a''a'…": lambda n: "echo " + "'a'" * n,
    "nested ( ( … ) )": lambda n: "(" * n + "a" + ")" * n,
}


def seconds(command: str, repeat: int = 1) -> float:
    best = float("inf")
    for _ in range(repeat):
        began = time.perf_counter()
        judge(RULES, "bash", {"command": command})
        best = min(best, time.perf_counter() - began)
    return best


def main() -> None:
    print("everyday commands (best of 50):")
    for command in EVERYDAY:
        verdict = judge(RULES, "bash", {"command": command})
        print(f"  {seconds(command, 50) * 1e3:7.3f} ms  {verdict.action:<7}  {command[:60]}")
    print("hostile command lines, n and 4n repetitions (best of 3):")
    for name, make in HOSTILE.items():
        small, large = make(4_000), make(16_000)
        if len(large) > 100_000:
            small, large = make(2_000), make(8_000)
        t1, t4 = seconds(small, 3), seconds(large, 3)
        sizes = f"{len(small):>6} chars {t1 * 1e3:8.1f} ms · {len(large):>6} chars {t4 * 1e3:8.1f} ms"
        print(f"  {name:<24} {sizes} · ratio {t4 / t1:5.1f}")


if __name__ == "__main__":
    main()
