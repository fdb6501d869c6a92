"""`tirbyoc build`: one shared library of the offloaded model with its extern code linked in
(`deploy`; a Hexagon target's through `deploy_hexagon`), and `runner`, which runs such a library
with TVM alone (it imports nothing of tirbyoc: a user copies it beside the library). Imports the
model_in and running rooms."""
