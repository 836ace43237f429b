"""What travels between the agent and its readers: the record format
(:mod:`.protocol`), the timeline series a sample feeds (:mod:`.timeline`),
how sizes and unmeasured values read (:mod:`.units`), where sockets live
and how every file is written (:mod:`.paths`), the socket client
(:mod:`.client`) and the Prometheus exposition (:mod:`.prometheus`).

Standard library only: the agent side imports it inside the user's job.
"""
