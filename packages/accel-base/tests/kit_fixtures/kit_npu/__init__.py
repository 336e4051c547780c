"""An Ascend-style adapter twice over, for the conformance kit's own tests: `realnpu` makes
every device call through its vendor module, `hollownpu` is the same adapter with every
device hook deleted (issue 18's "hollow adapter"), which the kit must fail."""
