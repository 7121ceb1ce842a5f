"""The trust boundaries, one file per class of attack: a team's lines, spend, bad input, webhook receivers,
names, storage, and deployment defaults. Each test drives real servers the way a hostile team would."""
