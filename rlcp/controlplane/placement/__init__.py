"""Placement: the controller keeping agents running on a cluster scheduler (kind `ray`).

Beside discovery, below the fleet: placement only starts and stops agents; they become members
through discovery (`discovery.kind: ray` reads the actors this places), and the reconciler
converges them like any other member. `ray` is imported only by `placement/ray.py`, and only
when `placement.kind == ray`.
"""
