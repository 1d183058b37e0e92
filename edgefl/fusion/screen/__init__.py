"""Screening poisoned uploads in output space (`--robust screen`, issue 18): one mechanism for
every method that consumes classifiers, decoders or predictions, judged once per ingest
(`judge` -> Verdict) and applied to each method's uploads (`apply`).

Robust aggregators such as Krum or the trimmed mean compare parameter vectors, which
heterogeneous classifiers, CVAE decoders and prediction tables are not. What every upload has
in common is what it outputs on the task's inputs, so each is judged there, against a reference
that a minority cannot move:

- the probe: draws of every decoder for each class it claims, labelled with the class asked
  for (where the judges read some decoder's draws plainly: labels no one reads, as DP-trained
  decoders' on HAPT, are no evidence and the committee labels the draws); else the method's
  public set (FedDF's), labelled by the median committee of the classifiers' probabilities
  where it is sure (3 at least: a median of 2 is moved by one).
  When some classifier looks relabelled, a class the probe lacks is covered, for the repair
  only, by images inverted from the classifiers not doubted that hold it (`_cover`);
- classifiers are judged on each class they claim (>= MIN_SHARE of their data) by how well
  their probability of the class ranks the reference's samples of it above the others (an
  informedness, 2 x AUC - 1: 0 for outputs that say nothing of the input); the score is the
  mean over those classes; set aside under KNOWS (or with one class under -KNOWS: ranked below
  chance, as a random network ranks some), an absolute bar, not one relative to the
  median client: a weakly trained honest client knows less than the others but more than
  chance (measured: half the median's agreement set aside 3 of 20 honest classifiers of 100
  optimiser steps and cost an ensemble 1.8 points; bench/results/robust_clean.md). One whose
  logits spread more than SCALE_RATIO times the median's is kept, tempered to the median
  scale: its knowledge is sound, only its weight in a logit average is not (measured: two x20
  attackers lifted a 5-teacher ensemble from 71.9 to 85.1 %, and screening them cost 6 points);
- repaired, not dropped: a classifier whose answers are a relabelling of the reference's (its
  classes permuted: trained on flipped or swapped labels) or their reverse (negated logits) is
  used as a copy whose head rows are permuted (and negated), its label counts relabelled with
  it. Dropping it would throw away the images of its classes, which under label skew no other
  client may hold (measured: screening two flipped teachers of five cost an ensemble 6 points;
  repairing them, 1.6). The reference for the repair leaves out the draws of decoders a first
  judgement doubts, and a move needs clear evidence (`_relabelling`), so an honest client that
  reads an unseen class as a similar one it holds is left as sent;
- decoders: the kept classifiers that hold a class read each decoder's draws of it; a decoder
  whose draws they read consistently as other classes (trained on flipped labels) is repaired
  like a classifier, as a copy that routes each class to the label that draws it. Each is then
  judged on its images, against the other decoders' (each shared class's median image,
  nearest-centroid reading), and by the classifiers' reading; with no classifier in the
  federation, on its images alone. Set aside on the same bar when neither finds its draws of a
  class read as that class more often than its draws of other classes;
- predictions uploads: judged like classifiers, on the public set they share.

Under label skew an honest client is judged only on the classes it holds, so its missing
classes never count against it; an attacker's lie about its labels is consistent with its
poisoned training, which is what it is judged on. Not repairable: an upload whose outputs
carry no knowledge (random weights, a noise decoder): screened, and its data lost to the
federation. A majority of attackers breaks any committee (measured: 4 of 5); when most uploads
of a kind would need a repair, the reference is taken to be the odd one and none is repaired.

The steps, one module each, lowest first: `verdict` (the Verdict and `apply`), `evidence`
(informedness and the one rule), `copies` (the changed copies used in an upload's place),
`probe`, `classifiers` (the screen and tempering, predictions alike), `cover` (inverted
images for the repair), `classifier_repair`, `decoders` (the screen), `decoder_repair`, and
`judgement` (the steps in order, and the shards of a large federation).
"""

from edgefl.fusion.screen.classifier_repair import Relabelling
from edgefl.fusion.screen.judgement import SHARD, judge, shards
from edgefl.fusion.screen.probe import Probe
from edgefl.fusion.screen.verdict import Verdict, apply

__all__ = ["SHARD", "Probe", "Relabelling", "Verdict", "apply", "judge", "shards"]
