#!/usr/bin/env bash
# config_exec of the metastatic GitLab custom executor: tells the runner where a job's files go on the
# node and which shell its generated scripts are written for. Prints JSON on stdout (the runner parses
# it); nothing in it comes from the job.
#
# builds_dir and cache_dir are relative: the generated scripts `cd` into them from the login directory
# of the node's user (a local node's slot directory; on EC2, the slot user's home with per-slot users),
# so two jobs packed on one backing node never share a checkout. builds_dir_is_shared adds the runner's
# short token and concurrent id to the path as well.
set -u
cat <<'JSON'
{
  "builds_dir": "builds",
  "cache_dir": "cache",
  "builds_dir_is_shared": true,
  "shell": "bash",
  "driver": { "name": "metastatic", "version": "1" }
}
JSON
