"""Prophet-style gradient-block planning: which gradients travel together, and in what order.

From a training profile (when each layer's gradient is ready, how long each block's all-reduce takes),
the blocks that let communication overlap the backward pass best.  ("Buckets" elsewhere in topocc are a
plan's message-size ranges; these are groups of gradients.)  Imports the plan format and units; the
topology only to time a plan.
"""
