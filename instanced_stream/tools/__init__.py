"""Development tools built on the product: `demo` (everything on embedded defaults),
`bench` and `soak` (measured ratios, `report` draws them), `eval` (decisions per window
against labels). Modules are imported where used."""

__all__ = ["bench", "demo", "eval", "report", "soak"]
