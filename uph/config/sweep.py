"""The fit stage's sweep points (head, alpha, d), and the solver a listed point names."""

from __future__ import annotations


def cross_user_solver(fit: dict, head: str, alpha, d) -> str:
    """The solver whose thetas the cross-user matrix at sweep point (head, alpha, d) scores."""
    point = (head, float(alpha), int(d))
    return next(p["solver"] for p in fit["cross_user"] if (p["head"], float(p["alpha"]), int(p["d"])) == point)


def sweep_points(fit: dict) -> list[tuple[str, float, int]]:
    """The sweep's points (head, alpha, d): fit.heads x fit.alphas x fit.ds, then fit.extra_points not
    among them, in that order."""
    points = [(h, float(a), int(d)) for h in fit["heads"] for a in fit["alphas"] for d in fit["ds"]]
    extra = [(p["head"], float(p["alpha"]), int(p["d"])) for p in fit["extra_points"]]
    return points + [point for i, point in enumerate(extra) if point not in points and point not in extra[:i]]
