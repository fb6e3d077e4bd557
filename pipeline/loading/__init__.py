"""What the pipeline builds from its settings, below the engines: the model, resolved, converted
and cached (model.py), and the drafters with the tables they draft from (drafters.py: the registry
from `drafting.drafter`'s names to drafters)."""
