#!/usr/bin/env bash
# Train every shipped checkpoint with its recipe, one after another, on this machine.
# Each run exports its release folder to checkpoints/<name>.<tag>/ with a model card.
# The leaderboard's checkpoints (the MNIST and Fashion-MNIST ViTs, the tiny-shakespeare GPTs and
# fused-3d-tiny.adrenal) are its seed-0 runs, made by
# `python bench/leaderboard.py` and `--ship`, which adds the other seeds' mean and spread to their
# cards; this script trains the same seed-0 runs without that table.
#   ZOO_DATA=../shared/data bash checkpoints/train_all.sh [RECIPE ...]
# The mini study's recipes (recipes/*-mini.*.yaml) take 1 to 9 hours each; those shipped (the runs that met both
# long-context targets) are last in the list. The others run by name, e.g.
#   bash checkpoints/train_all.sh gpt-mini.warpeace gpt-mini.stdlib
set -u
data=${ZOO_DATA:-../shared/data}
recipes=("$@")
if [ ${#recipes[@]} -eq 0 ]; then
  recipes=(micro-vit-tiny.mnist fused-pool-vit-tiny.mnist fused-1d-tiny.mnist1d fused-3d-tiny.adrenal
           gpt-tiny.shakespeare quiet-gpt-tiny.shakespeare micro-gpt-tiny.shakespeare elita-gpt-tiny.shakespeare
           incontext-gpt-tiny.shakespeare hybrid-micro-gpt-tiny.shakespeare hybrid-elita-gpt-tiny.shakespeare
           hybrid-micro-conv-gpt-tiny.shakespeare hybrid-elita-conv-gpt-tiny.shakespeare
           hybrid-elita-conv1-gpt-tiny.shakespeare
           hybrid-micro-vit-tiny.mnist incontext-vit-tiny.mnist
           fused-2d-tiny.mnist vit-tiny.mnist quiet-vit-tiny.mnist
           micro-vit-tiny.fashion vit-tiny.fashion quiet-vit-tiny.fashion fused-pool-vit-tiny.fashion
           gpt-tiny.warpeace gpt-tiny.warpeace-rope gpt-tiny.warpeace-alibi micro-gpt-tiny.warpeace
           elita-gpt-tiny.warpeace elita-gpt-tiny.warpeace-nopos
           elita-gpt-tiny.warpeace-alibi micro-gpt-tiny.warpeace-alibi hybrid-elita-gpt-tiny.warpeace
           hybrid-micro-gpt-tiny.warpeace hybrid-micro-conv-gpt-tiny.warpeace
           deltanet-gpt-tiny.warpeace gla-gpt-tiny.warpeace window-gpt-tiny.warpeace ssd-gpt-tiny.warpeace
           elita-gpt-mini.warpeace elita-gpt-mini.stdlib)
fi
for recipe in "${recipes[@]}"; do
  if [[ $recipe == *shakespeare ]]; then
    source_arg=(--data.init_args.path "$data/tinyshakespeare/input.txt")
  elif [[ $recipe == *warpeace* ]]; then
    source_arg=(--data.init_args.path "$data/warpeace/warpeace_input.txt")
  elif [[ $recipe == *stdlib ]]; then  # the running Python's own library: no data folder
    source_arg=()
  else
    source_arg=(--data.init_args.root "$data")
  fi
  echo "== $recipe"
  zoo fit --config "recipes/$recipe.yaml" "${source_arg[@]}" --trainer.enable_progress_bar false \
    || echo "!! $recipe failed"
done
