"""Check results and the PASS/WARN/FAIL table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["CheckResult", "CheckReport", "passed", "warned", "failed", "skipped"]


@dataclass
class CheckResult:
    """One check: a stable ``name`` (its code, :data:`ppokit.checks.codes.CHECKS`),
    whether it ``passed`` (``None`` = skipped), the ``measured`` figure as text (the
    evidence), the ``criterion`` it was held to, a ``detail`` line (what it means when it
    fails or warns, or why it was skipped), the numbers behind it (``values``) and the
    ``fix`` to try, in one line. ``warn``: passed, but with something worth a look (WARN:
    likely wrong, though only the author can tell; FAIL: wrong)."""

    name: str
    passed: bool | None
    measured: str
    criterion: str
    detail: str = ""
    values: dict = field(default_factory=dict)
    warn: bool = False
    fix: str = ""

    @property
    def status(self) -> str:
        if self.passed is True and self.warn:
            return "WARN"
        return {True: "PASS", False: "FAIL", None: "SKIP"}[self.passed]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["status"] = self.status
        return d


@dataclass
class CheckReport:
    """All results of one ``run_checks`` call; ``ok`` is False when any check failed (a
    warning does not make it False)."""

    target: str
    results: list[CheckResult]

    @property
    def ok(self) -> bool:
        return not any(r.passed is False for r in self.results)

    @property
    def failed(self) -> list[str]:
        return [r.name for r in self.results if r.passed is False]

    @property
    def warned(self) -> list[str]:
        return [r.name for r in self.results if r.status == "WARN"]

    def to_dict(self) -> dict:
        return {"target": self.target, "ok": self.ok,
                "results": [r.to_dict() for r in self.results]}

    def __getitem__(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(name)

    def names(self) -> list[str]:
        return [r.name for r in self.results]

    def print_plain(self, out=None) -> None:
        """The results off a terminal (a log, a pipe): one line per check, then what each
        check that did not pass means, its fix and where it is explained."""
        import sys
        import textwrap

        out = out or sys.stdout
        print(f"ppokit check: {self.target}", file=out)
        width = max(len(r.name) for r in self.results) if self.results else 0
        for r in self.results:
            print(f"{r.status:4s}  {r.name:{width}s}  {r.measured}  [{r.criterion}]", file=out)
        for r in self.results:
            if r.status != "PASS" and r.detail:
                print(f"\n{r.status} {r.name}:", file=out)
                print(textwrap.fill(r.detail, width=100, initial_indent="    ",
                                    subsequent_indent="    "), file=out)
                if r.fix:
                    print(textwrap.fill(f"fix: {r.fix}", width=100, initial_indent="    ",
                                        subsequent_indent="         "), file=out)
                print(f"    explained: docs/checks.md, row {r.name}", file=out)
        n_fail, n_warn = len(self.failed), len(self.warned)
        warned = f", {n_warn} warning(s)" if n_warn else ""
        print(f"all checks passed{warned}" if self.ok else f"{n_fail} check(s) failed{warned}",
              file=out)

    def print(self, console=None) -> None:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        if console is None:
            console = Console()
            if not console.is_terminal:
                return self.print_plain()
        table = Table(title=f"ppokit check: {self.target}", title_justify="left")
        table.add_column("check", no_wrap=True)
        table.add_column("result", no_wrap=True)
        table.add_column("measured")
        table.add_column("criterion")
        colour = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}
        for r in self.results:
            table.add_row(r.name, f"[{colour[r.status]}]{r.status}[/]", escape(r.measured),
                          escape(r.criterion))
        console.print(table)
        for r in self.results:
            if r.status != "PASS" and r.detail:
                console.print(f"[{colour[r.status]}]{r.status}[/] {r.name}: "
                              f"{escape(r.detail)}")
                if r.fix:
                    console.print(f"     fix: {escape(r.fix)}")
                console.print(f"     explained: docs/checks.md, row {escape(r.name)}")
        n_fail, n_warn = len(self.failed), len(self.warned)
        warned = f", {n_warn} warning(s)" if n_warn else ""
        console.print(f"all checks passed{warned}" if self.ok else
                      f"{n_fail} check(s) failed{warned}")


def passed(name, measured, criterion, fix="", **values) -> CheckResult:
    return CheckResult(name, True, measured, criterion, "", values, fix=fix)


def warned(name, measured, criterion, detail, fix, **values) -> CheckResult:
    return CheckResult(name, True, measured, criterion, detail, values, warn=True, fix=fix)


def failed(name, measured, criterion, detail, fix, **values) -> CheckResult:
    return CheckResult(name, False, measured, criterion, detail, values, fix=fix)


def skipped(name, criterion, why) -> CheckResult:
    return CheckResult(name, None, "-", criterion, why)
