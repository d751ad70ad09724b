"""The embedded replay: the driver that serves a workload under a policy on the ground-truth simulator,
its accounting, the tuned reference's selection, the imposed-action validation and the `aurelius replay` command."""
