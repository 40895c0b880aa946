#include "daemon/reflection.h"

#include <set>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

namespace kvstream::daemon {
namespace {

namespace pb = google::protobuf;
namespace rv = grpc::reflection::v1alpha;

void SetError(rv::ServerReflectionResponse* out, grpc::StatusCode code, const std::string& msg) {
  out->mutable_error_response()->set_error_code(code);
  out->mutable_error_response()->set_error_message(msg);
}

// `file` and everything it imports, each once, the file first.
void AddFileAndImports(const pb::FileDescriptor* file, std::set<std::string>* seen,
                       rv::FileDescriptorResponse* out) {
  if (!seen->insert(file->name()).second) return;
  pb::FileDescriptorProto proto;
  file->CopyTo(&proto);
  out->add_file_descriptor_proto(proto.SerializeAsString());
  for (int i = 0; i < file->dependency_count(); ++i) AddFileAndImports(file->dependency(i), seen, out);
}

void AnswerFile(const pb::FileDescriptor* file, const std::string& what,
                rv::ServerReflectionResponse* out) {
  if (file == nullptr) return SetError(out, grpc::StatusCode::NOT_FOUND, what + " not found");
  std::set<std::string> seen;
  AddFileAndImports(file, &seen, out->mutable_file_descriptor_response());
}

}  // namespace

ReflectionService::ReflectionService(std::vector<std::string> services,
                                     std::shared_ptr<const Authorizer> authz)
    : services_(std::move(services)), authz_(std::move(authz)) {
  services_.push_back("grpc.health.v1.Health");
  services_.push_back(rv::ServerReflection::service_full_name());
}

rv::ServerReflectionResponse ReflectionService::Answer(const rv::ServerReflectionRequest& req) const {
  const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
  rv::ServerReflectionResponse out;
  out.set_valid_host(req.host());
  *out.mutable_original_request() = req;
  switch (req.message_request_case()) {
    case rv::ServerReflectionRequest::kListServices:
      for (const std::string& s : services_)
        out.mutable_list_services_response()->add_service()->set_name(s);
      break;
    case rv::ServerReflectionRequest::kFileByFilename:
      AnswerFile(pool->FindFileByName(req.file_by_filename()), "file " + req.file_by_filename(), &out);
      break;
    case rv::ServerReflectionRequest::kFileContainingSymbol:
      AnswerFile(pool->FindFileContainingSymbol(req.file_containing_symbol()),
                 "symbol " + req.file_containing_symbol(), &out);
      break;
    case rv::ServerReflectionRequest::kFileContainingExtension: {
      const auto& e = req.file_containing_extension();
      const pb::Descriptor* type = pool->FindMessageTypeByName(e.containing_type());
      const pb::FieldDescriptor* ext =
          type ? pool->FindExtensionByNumber(type, e.extension_number()) : nullptr;
      AnswerFile(ext ? ext->file() : nullptr,
                 "extension " + std::to_string(e.extension_number()) + " of " + e.containing_type(),
                 &out);
      break;
    }
    case rv::ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const pb::Descriptor* type = pool->FindMessageTypeByName(req.all_extension_numbers_of_type());
      if (type == nullptr) {
        SetError(&out, grpc::StatusCode::NOT_FOUND, "type " + req.all_extension_numbers_of_type() + " not found");
        break;
      }
      std::vector<const pb::FieldDescriptor*> exts;
      pool->FindAllExtensions(type, &exts);
      auto* r = out.mutable_all_extension_numbers_response();
      r->set_base_type_name(type->full_name());
      for (const pb::FieldDescriptor* f : exts) r->add_extension_number(f->number());
      break;
    }
    default:
      SetError(&out, grpc::StatusCode::UNIMPLEMENTED, "request type not known");
  }
  return out;
}

grpc::Status ReflectionService::ServerReflectionInfo(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<rv::ServerReflectionResponse, rv::ServerReflectionRequest>* stream) {
  if (grpc::Status a = authz_->Check(*ctx, Method::kReflection); !a.ok()) return a;
  rv::ServerReflectionRequest req;
  while (stream->Read(&req))
    if (!stream->Write(Answer(req))) break;
  return grpc::Status::OK;
}

}  // namespace kvstream::daemon
