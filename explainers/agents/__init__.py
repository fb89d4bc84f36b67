"""Deep-RL agents in ViZDoom: environments with masks of what matters, a compact PPO actor-critic, CAMAL on the critic."""
