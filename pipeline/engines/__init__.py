"""Engines turn requests into results with statistics (base.py); build.py makes the one
`engine.name` names. Nothing above this package knows which one it holds."""
