"""Where a gang goes, and its life from the first member to the last bind.

Planning: `planner` (`plan_gang`, the gang objective of design.md §5), `domain` (one domain
worked out, with the bounds that skip what cannot win), `singleoffer` (levels where no node takes
two members), `candidate` (a domain's candidate plan), `memo` (`PlanMemo`, what the caller keeps
across plans), `packing` (fewest nodes), `spread` (fewest sub-domains), `cost` (the cluster
objective's cost of a plan) and `reasons` (why nothing fits). Over time: `tracker`
(`GangTracker`: quorum, plan, reserve, bind, re-plan), `asks` (what a caller asks it and what it
answers), `levelwait` (waiting for the gang's own level) and `reservations`.
"""
