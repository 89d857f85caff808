"""The streamed target: weights in (pinned) host memory, copied to the device layer by layer for every forward.

``checkpoint.py`` reads a safetensors folder tensor by tensor into buffers the caller owns; ``stream.py`` is
the copy/compute schedule (device slots, a side stream, events); ``runner.py`` builds the model skeleton,
fills it and serves it behind the Hugging Face runner's session (the same tree-mask forward).
"""
