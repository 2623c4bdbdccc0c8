# Which pull-request reviews count as objections (verdicts.yml): a
# "changes requested" review by someone with a role in the repository.
# Anyone can review a public pull request; a review by an outsider
# (CONTRIBUTOR, FIRST_TIME_CONTRIBUTOR, NONE, ...) is not an objection.
# Input: the array of GET /repos/{owner}/{repo}/pulls/{n}/reviews.
# Output: one tab-separated line per objection: id, login, commit, the
# first line of the review's text (at most 200 characters).
.[]
| select(.state == "CHANGES_REQUESTED")
| select(.author_association == "OWNER"
         or .author_association == "MEMBER"
         or .author_association == "COLLABORATOR")
| [.id, .user.login, .commit_id, ((.body // "") | split("\n")[0] | .[0:200])]
| @tsv
