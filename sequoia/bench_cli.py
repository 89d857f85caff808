"""Placeholder: the bench command is being written (issue 5)."""


def add_bench_parser(sub) -> None:
    sub.add_parser("bench", help="(in progress)")


def run_bench(args) -> int:
    raise ValueError("the bench command is not available in this build")
