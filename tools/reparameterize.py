"""Function-preserving reparameterization of an MLA checkpoint, from the command line (harness/reparameterize.py does
the edit and documents it):

    python -m tools.reparameterize --model CKPT --out CKPT-a128 --alpha 128 --latent-spread 16
"""

from harness.reparameterize import main

if __name__ == "__main__":
    main()
