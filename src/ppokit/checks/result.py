"""Check results and the PASS/FAIL table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["CheckResult", "CheckReport"]


@dataclass
class CheckResult:
    """One check: a stable ``name``, whether it ``passed`` (``None`` = skipped), the
    ``measured`` figure as text, the ``criterion`` it was held to and a ``detail`` line
    (what it means when it fails, or why it was skipped)."""

    name: str
    passed: bool | None
    measured: str
    criterion: str
    detail: str = ""
    values: dict = field(default_factory=dict)

    @property
    def status(self) -> str:
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status
        return d


@dataclass
class CheckReport:
    """All results of one ``run_checks`` call; ``ok`` is False when any check failed."""

    target: str
    results: list[CheckResult]

    @property
    def ok(self) -> bool:
        return not any(r.passed is False for r in self.results)

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results if r.passed is False]

    def __getitem__(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def names(self) -> list[str]:
        return [r.name for r in self.results]

    def print(self, console=None) -> None:
        from rich.console import Console
        from rich.table import Table

        if console is None:
            console = Console()
            console.width = max(console.width, 110)
        table = Table(title=f"ppokit check: {self.target}", title_justify="left")
        table.add_column("check", no_wrap=True)
        table.add_column("result", no_wrap=True)
        table.add_column("measured")
        table.add_column("criterion")
        colour = {"PASS": "green", "FAIL": "bold red", "SKIP": "dim"}
        for r in self.results:
            table.add_row(r.name, f"[{colour[r.status]}]{r.status}[/]", r.measured, r.criterion)
        console.print(table)
        for r in self.results:
            if r.passed is not True and r.detail:
                console.print(f"[{colour[r.status]}]{r.status}[/] {r.name}: {r.detail}")
        n_fail = len(self.failed)
        console.print("all checks passed" if self.ok else f"{n_fail} check(s) failed")
