"""The experts a rollout engine's decode loop sends every token to (``rollout.enable_rollout_routing_replay``).

The HF engine runs a micro-batch of prompts as one prefill (each distinct prompt once, its rows then
copied out) and then one decode step per response column; :class:`RouteRecorder` reads the model's
:class:`~rlvr.workers.moe.routers.RouterTap` after each of those calls and writes the choices into
``routed_experts [b, P + R, layers, k]`` (the layout of :mod:`rlvr.workers.moe.layout`). A decode
step feeds the token sampled one step earlier, so the last sampled token of a row that ran to the
end of the budget, which no step fed, keeps ``-1``, as do all padding columns.
"""

from __future__ import annotations

import torch

from rlvr.workers.moe.layout import empty_routes
from rlvr.workers.moe.routers import RouterTap

__all__ = ["RouteRecorder"]


class RouteRecorder:
    """Records one micro-batch's routes while the engine decodes it (arms ``tap`` until :meth:`finish`).

    Args:
        tap: the engine's model's router tap.
        rows: ``b``, the micro-batch's rows.
        prompt_width: ``P``, the prompt columns (left-padded).
        response_len: ``R``, the response columns.
    """

    def __init__(self, tap: RouterTap, rows: int, prompt_width: int, response_len: int) -> None:
        shape = tap.shape
        self.tap = tap
        self.prompt_width = prompt_width
        self.routes = empty_routes(rows, prompt_width + response_len, shape.layers, shape.top_k, shape.num_experts)
        tap.arm()

    def prefill(self, start: int, row_of_prompt: torch.Tensor | None) -> None:
        """After the prefill of prompt columns ``start:P``: ``row_of_prompt [b]`` maps each row to the
        prefilled row it copies (None: every row was prefilled)."""
        routes = self.tap.routes()
        routes = routes.view(-1, self.prompt_width - start, *routes.shape[1:])
        if row_of_prompt is not None:
            routes = routes[row_of_prompt]
        self.routes[:, start : self.prompt_width] = routes.to(self.routes.dtype).cpu()

    def step(self, column: int) -> None:
        """After a decode step that fed the tokens of response column ``column`` (one per row)."""
        self.routes[:, self.prompt_width + column] = self.tap.routes().to(self.routes.dtype).cpu()

    def finish(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """Disarm the tap; the routes ``[b, P + R, layers, k]`` int16, ``-1`` where ``attention_mask
        [b, P + R]`` (the output's) is 0."""
        self.tap.disarm()
        return self.routes.masked_fill(~attention_mask.bool()[:, :, None, None], -1)
