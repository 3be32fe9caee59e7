# args: [["alice", "bob", "carol"], ["bob", "dave", "carol", "erin"]]
team_a, team_b = set(args[0]), set(args[1])
return {
    "both": sorted(team_a & team_b),
    "either": sorted(team_a | team_b),
    "only_a": sorted(team_a - team_b),
    "sym": sorted(team_a ^ team_b),
    "subset": {"bob"} <= team_a,
}
