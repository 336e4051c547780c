"""Typed settings: the kwargs handlers and configuration dataclasses (`kwargs`), accel's config file
(`config_file`), and what the environment says (`env`), each read in one place."""
