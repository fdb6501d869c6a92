"""The application layer, in rooms by command, each importing only the rooms before it
(`tests/test_layers.py`):

    model_in < running < building < sweeping < commands

``model_in`` (how a model comes in: frontends, loaders, the built-in models, inputs, sizes,
`legalized_model`), ``running`` (`tirbyoc run`), ``building`` (`tirbyoc build` and the runner
of a built library), ``sweeping`` (`tirbyoc sweep`: search spaces, strategies, engines) and
``commands`` (the command line). Beside them the records every room shares: `options`
(`RunOptions`) and `jsonout` (strict JSON). The front door is `tirbyoc` itself
(``tirbyoc.run_model``, ``build_library``, ``sweep``, ...)."""
