"""Deep-RL agents in ViZDoom: environments with masks of what matters, a compact PPO actor-critic, and CAMAL on
the critic (its V(s) Grad-CAM pulled inside the masks). See docs/agents.md."""
