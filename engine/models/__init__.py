"""The stage models: the talker and its code predictor (talker.py, layers.py), the codec (code2wav.py),
their sizes (presets.py), the text's tokens (tokenizer.py), and their construction from a seed or a
checkpoint (build.py).

The package itself imports nothing, so that a process that only tokenizes text or reads a preset's
constants (the engine's client, the server, a pytest run that starts engines) does not load torch: the
stage processes, which build the models, do."""
