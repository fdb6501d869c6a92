"""What every rewrite shares: the steps a rewrite reports (`steps`), the state a block's
rewrite carries from stage to stage (`state`) and the ordered list of named stages with the
runner that walks it (`pipeline`). Imports no other room."""
